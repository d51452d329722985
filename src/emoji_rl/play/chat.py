"""A game played in chat turns on token ids: the policy writes the assistant's turns, the game the
user's. The episode stays one token sequence: the game's next message is appended as ids after the
policy's sampled ones (`template.continuation_ids`), never re-tokenized, so what the trainer scores is
what the sampler saw. The retrieval game, Wordle and the reader are chat games; a game that seats the
policy twice holds a `Chat` per seat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from emoji_rl.lm.template import chat_ids, continuation_ids, end_of_turn_ids
from emoji_rl.play.types import Env

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Message = dict[str, str]


class Chat:
    """One chat on token ids: its opening, the policy's turns read as text, and the next messages
    as the ids that extend it. A game holds one (`ChatEnv`), or one per seat it gives the policy."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, opening: list[Message]) -> None:
        self.tokenizer = tokenizer
        self.history = list(opening)
        self._turn_ends = frozenset(end_of_turn_ids(tokenizer))

    def opening_ids(self) -> tuple[int, ...]:
        """The chat so far with the generation prompt: a seat's first observation."""
        return tuple(chat_ids(self.tokenizer, self.history))

    def read(self, action_ids: tuple[int, ...]) -> tuple[str, bool]:
        """The policy's turn as text up to its end-of-turn token (any id that ends a turn on a vLLM
        server too: `template.end_of_turn_ids`), and whether it ended: a turn cut off by the token
        budget has none."""
        ended = bool(action_ids) and action_ids[-1] in self._turn_ends
        text = self.tokenizer.decode(action_ids[:-1] if ended else action_ids, skip_special_tokens=True)
        return text, ended

    def reply(self, text: str, action_ids: tuple[int, ...], message: Message) -> tuple[int, ...]:
        """The next observation: `message` after the policy's turn (`text`, sampled as `action_ids`),
        as the ids that extend the episode; a turn cut off is closed first."""
        observation = continuation_ids(self.tokenizer, self.history, message, action_ids)
        self.history = [*self.history, {"role": "assistant", "content": text}, message]
        return tuple(observation)


class ChatEnv(Chat, Env):
    """The opening chat, the policy's turns read as text, and the game's replies as token ids. A
    subclass decides what each turn means in `step`."""

    async def start(self) -> tuple[int, ...]:
        return self.opening_ids()
