"""The frozen judge of the retrieval game (docs/DESIGN.md §4): it sees the sender's emoji turns and its own
earlier guesses, never the target, and answers with one plain sentence.

Kinds:
- `lexicon`: no LLM; the guess is the names of the emoji sent so far. Deterministic and fast: for
  tests, for the cpu demo when time is short, and as the floor any LLM judge should beat.
- `hf`: a frozen causal LM in this process, batched decoding (`game.completer.HFCompleter`).
- `openai`: any OpenAI-compatible server, such as vLLM serving Qwen/Qwen3-30B-A3B-Instruct-2507
  (launch/serve_judge.sh; docs/DESIGN.md §4, docs/VLLM.md §3): one `/v1/chat/completions` request
  per episode (`game.completer.OpenAICompleter`).
Both LLM judges send `judge_messages(...)` with the sampling settings below and pass each answer
through `clean_guess`; `Judge.guess` is async for the server's sake. The chat itself, the views (`raw`,
`gloss`) and the reading of an answer are the guessing chat every guessing game shares (play/guessing.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

from emoji_rl.play.completer import THINKING_OFF, Completer, Completion, HFCompleter, OpenAICompleter
from emoji_rl.play.guessing import (
    UNKNOWN,
    Guess,
    JudgeInput,
    JudgeView,
    clean_guess,
    judge_messages,
    plain_name,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from emoji_rl.io.endpoint import Endpoint

JudgeKind = Literal["lexicon", "hf", "openai"]

TEMPERATURE = 0.3
MAX_NEW_TOKENS = 40
BATCH_SIZE = 16  # hf judge: episodes per generate call
# Distinct inputs a greedy hf judge remembers its guess for (the oldest forgotten first): a 2,560-episode
# GRPO run of SmolLM2 senders sent the same emoji 38% of the time, an evaluation of five systems 37%.
MEMO_SIZE = 100_000
# The first sentence is the answer (`clean_guess` drops the rest): stopping at the first token that
# ends one cut a row from 40 generated tokens to about 11.
SENTENCE_ENDS = ".!?\n"


class Judge(ABC):
    """A frozen guesser, built once and passed to the game; batched so that one call serves B x G episodes."""

    @abstractmethod
    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        """One guess per episode, in order."""

    @abstractmethod
    def describe(self) -> str:
        """Kind, view and model, for logs and reports."""

    @property
    def endpoint(self) -> Endpoint | None:
        """The server it asks (None in process)."""
        return None


# --- judges ----------------------------------------------------------------------------------------


class LexiconJudge(Judge):
    """The guess is the names of every distinct emoji sent so far, in order: `pizza, clapper board`."""

    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        return [self._names(episode) for episode in episodes]

    @staticmethod
    def _names(episode: JudgeInput) -> Guess:
        names = dict.fromkeys(plain_name(e) for turn in episode.turns for e in turn)
        text = ", ".join(names) or UNKNOWN
        return Guess(text=text, raw=text)

    def describe(self) -> str:
        return "lexicon"


class LLMJudge(Judge):
    """A frozen LLM as the judge: it answers `judge_messages`, and each answer is cleaned to one
    sentence (`clean_guess`)."""

    def __init__(self, completer: Completer, view: JudgeView) -> None:
        self.completer = completer
        self.view: JudgeView = view

    async def guess(self, episodes: Sequence[JudgeInput]) -> list[Guess]:
        answers = await self.completer.complete([judge_messages(episode, self.view) for episode in episodes])
        return [clean_guess(answer) for answer in answers]

    def describe(self) -> str:
        return self.completer.describe(f"view={self.view}")

    @property
    def endpoint(self) -> Endpoint | None:
        return self.completer.endpoint


class HFJudge(LLMJudge):
    """A frozen causal LM in this process: pending episodes decoded in batches, each distinct input
    once at temperature 0 (up to MEMO_SIZE of them), an answer stopped at its first sentence's end."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        view: JudgeView,
        name: str,
        batch_size: int = BATCH_SIZE,
        temperature: float = TEMPERATURE,
        max_new_tokens: int = MAX_NEW_TOKENS,
    ) -> None:
        settings = Completion(temperature, max_new_tokens)
        completer = HFCompleter(
            model, tokenizer, name, settings, batch_size=batch_size, stop_text=SENTENCE_ENDS, memo=MEMO_SIZE
        )
        super().__init__(completer, view)


class OpenAIJudge(LLMJudge):
    """A frozen judge behind an OpenAI-compatible `/v1/chat/completions`."""

    def __init__(
        self,
        endpoint: Endpoint,
        model: str,
        view: JudgeView = "raw",
        *,
        max_concurrency: int = 64,
        temperature: float = TEMPERATURE,
        max_tokens: int = MAX_NEW_TOKENS,
        chat_template_kwargs: Mapping[str, object] | None = THINKING_OFF,
    ) -> None:
        completer = OpenAICompleter(
            endpoint,
            model,
            Completion(temperature, max_tokens),
            max_concurrency=max_concurrency,
            chat_template_kwargs=chat_template_kwargs,
            model_hint="JUDGE_NAME in launch/serve_judge.sh",
        )
        super().__init__(completer, view)

    def request_body(self, episode: JudgeInput) -> dict[str, object]:
        assert isinstance(self.completer, OpenAICompleter)
        return self.completer.request_body(judge_messages(episode, self.view))
