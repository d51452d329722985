"""A scripted policy and a scripted partner for games' tests: no model samples."""

from emoji_rl.decode.sampler import Sample
from emoji_rl.lm import template
from emoji_rl.play.completer import Completer, Completion


class ScriptedSampler:
    """Answers turn t of every episode with the t-th scripted text, tokenized, plus end of turn."""

    def __init__(self, tokenizer, script, end_turn=True):
        self.tokenizer, self.script, self.end_turn = tokenizer, script, end_turn
        self.prompts, self.previous, self.samples, self.constraints = [], [], [], []

    async def sample(self, prompts, previous=None, *, constraint=None):
        self.prompts.append(list(prompts))
        self.previous.append(list(previous))
        self.constraints.append(constraint)
        text = self.script[len(self.prompts) - 1]
        ids = tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if self.end_turn:
            ids += (template.stop_token_id(self.tokenizer),)
        self.samples.append([Sample(ids, tuple(-1.0 for _ in ids)) for _ in prompts])
        return self.samples[-1]


class ScriptedSender(Completer):
    """Answers call t with the t-th scripted text, for every chat of the call; keeps what it was asked."""

    def __init__(self, answers):
        self.settings = Completion(0.0, 16, emoji=True)
        self.answers, self.calls = answers, []

    async def complete(self, chats):
        self.calls.append([list(chat) for chat in chats])
        return [self.answers[len(self.calls) - 1]] * len(chats)

    def describe(self, *details):
        return "scripted"
