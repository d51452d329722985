"""The in-process completer on the embedded SmolLM2: answers under the emoji grammar, with and without
a stop character, and a greedy one decodes each distinct chat once."""

import asyncio

from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.play.completer import Completion, HFCompleter


def test_an_emoji_partner_without_stop_text_answers_emoji_messages(smollm2_model, smollm2_tokenizer):
    completer = HFCompleter(smollm2_model, smollm2_tokenizer, "smollm2", Completion(0.0, 24, emoji=True))
    chats = [sender_messages("Let's get pizza tonight"), sender_messages("The train is late")]
    answers = asyncio.run(completer.complete([chats[0], chats[1], chats[0]]))
    assert all(parse_message(answer).ok for answer in answers)
    assert answers[0] == answers[2] and len(completer._answers) == 2
