"""The reader's seat (docs/DESIGN.md §13): the policy reads emoji and writes its guess of the message
in words. Turn 1 shows the teacher's emoji for the message; from turn 2 on a frozen sender
(`partner.py`) sees the message and the reader's last guess and adds emoji, and the reader guesses
again. The game ends when a guess reaches `tau` or after `max_turns` guesses; the reward is terminal
(`play/reward.py`).

The reader is shown the very chat the retrieval game's judge is (`judge_messages`: its system prompt,
worked examples, each emoji turn as a user turn, its own guesses as its turns) and its guess is
cleaned as the judge's is (`clean_guess`): a reader trained here sits in that judge's seat unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emoji_rl.config import override
from emoji_rl.emoji.alphabet import SEPARATOR
from emoji_rl.games.reader.partner import Partner, PartnerInput
from emoji_rl.play.batching import MicroBatcher
from emoji_rl.play.chat import ChatEnv
from emoji_rl.play.guessing import (
    UNKNOWN,
    Guess,
    JudgeInput,
    JudgeView,
    ReaderViewConfig,
    clean_guess,
    judge_messages,
)
from emoji_rl.play.reward import reader_reward
from emoji_rl.play.similarity import GuessScorer
from emoji_rl.play.spec import GameConfig
from emoji_rl.play.types import StepResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.play.types import Record

MAX_TURNS = 3
TAU = 0.85
SUCCESS_THRESHOLDS = (0.3, 0.5, 0.7)

AddEmoji = Callable[[PartnerInput], Awaitable["tuple[str, ...] | None"]]


@dataclass
class ReaderConfig(GameConfig, ReaderViewConfig):
    """The reader game's length, what the reader is shown, and when a guess ends the game."""

    max_turns: int = override(GameConfig, "max_turns", MAX_TURNS, help="reader guesses before the game ends")
    tau: float = field(
        default=TAU,
        metadata={
            "help": "similarity that ends the game: the sender has nothing to correct (a cosine "
            "similarity, so in [-1, 1]: above 1 no guess ends a game)",
            "min": -1.0,
            "max": 1.0,
        },
    )


@dataclass(frozen=True)
class ReaderRules:
    """The game's settings, the same for every episode of a run."""

    max_turns: int = MAX_TURNS
    tau: float = TAU
    view: JudgeView = "gloss"
    contrast: float = 0.0


class ReaderEnv(ChatEnv):
    """One episode for one message and the teacher's emoji for it. `add_emoji` and `score` are shared,
    batched services."""

    def __init__(
        self,
        target: str,
        emoji: tuple[str, ...],
        tokenizer: PreTrainedTokenizerBase,
        add_emoji: AddEmoji,
        score: GuessScorer,
        rules: ReaderRules,
    ) -> None:
        super().__init__(tokenizer, judge_messages(JudgeInput((emoji,)), rules.view))
        self.target = target
        self.add_emoji = add_emoji
        self.score = score
        self.rules = rules
        self.turns: list[tuple[str, ...]] = [emoji]
        self.guesses: list[Guess] = []
        self.similarities: list[float] = []
        self.cut_off = 0

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        # 1. the guess, cleaned as the judge's are; a turn the token budget cut off still guesses
        text, ended = self.read(action_ids)
        guess = clean_guess(text)
        self.guesses.append(guess)
        self.cut_off += not ended
        similarity, background = await self.score((self.target, guess.text))
        self.similarities.append(similarity)
        log = {"emoji": " ".join(self.turns[-1]), "guess": guess.text, "reader_raw": text}
        if similarity >= self.rules.tau or len(self.guesses) == self.rules.max_turns:
            return self._finish(background, log, partner_failed=False)
        # 2. the sender sees the message and every guess so far, and adds emoji
        seen = tuple(g.text for g in self.guesses)
        added = await self.add_emoji(PartnerInput(self.target, tuple(self.turns), seen))
        if added is None:  # nothing to show: the last guess stands
            return self._finish(background, log, partner_failed=True)
        self.turns.append(added)
        # 3. shown as the judge's next turn is
        message = judge_messages(JudgeInput(tuple(self.turns), seen), self.rules.view)[-1]
        observation = self.reply(text, action_ids, message)
        metrics = {"similarity": similarity}
        return StepResult(done=False, reward=0.0, next_observation_ids=observation, metrics=metrics, log=log)

    def _finish(self, background: float, log: dict[str, str], partner_failed: bool) -> StepResult:
        final = self.similarities[-1]
        terms = reader_reward(final, background, self.rules.contrast)
        metrics = {
            "similarity": final,
            "first_similarity": self.similarities[0],
            "background": background,
            "turns": float(len(self.guesses)),
            "cut_off": self.cut_off / len(self.guesses),
            "unknown": float(self.guesses[-1].text == UNKNOWN),
            "emoji_stripped": float(any(g.stripped_emoji for g in self.guesses)),
            "partner_failed": float(partner_failed),
            **{f"success@{t}": float(final >= t) for t in SUCCESS_THRESHOLDS},
            **{f"reward/{name}": value for name, value in terms.items()},
        }
        return StepResult(done=True, reward=terms["total"], metrics=metrics, log=log)


class ReaderBuilder:
    """Builds one game per record ({"id", "target", "emoji"}), all sharing one partner and one
    embedder through micro-batchers: the B x G games of a step make one sender call and one embedding
    call per turn."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, partner: Partner, score: GuessScorer, rules: ReaderRules
    ) -> None:
        self.tokenizer = tokenizer
        self.partner = partner
        self.score = score
        self.rules = rules
        self.partner_seconds = 0.0
        self._add_emoji: MicroBatcher[PartnerInput, tuple[str, ...] | None] = MicroBatcher(
            self._partner_batch
        )

    @property
    def seconds(self) -> dict[str, float]:
        """Spent in the sender and in scoring since the start."""
        return {"partner": self.partner_seconds, "similarity": self.score.seconds}

    async def _partner_batch(self, inputs: Sequence[PartnerInput]) -> list[tuple[str, ...] | None]:
        start = time.perf_counter()
        added = await self.partner.add(inputs)
        self.partner_seconds += time.perf_counter() - start
        return added

    def __call__(self, record: Record) -> ReaderEnv:
        emoji = tuple(record["emoji"].split(SEPARATOR))
        return ReaderEnv(record["target"], emoji, self.tokenizer, self._add_emoji, self.score, self.rules)
