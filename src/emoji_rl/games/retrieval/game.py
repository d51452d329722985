"""The retrieval game (docs/DESIGN.md §3): the sender sees a message and answers in emoji; a frozen judge,
which never sees the message, guesses it from the emoji; the guess is scored by MiniLM similarity.
The game ends at similarity >= tau or after `max_turns`; on later turns the sender sees the judge's
guess and the original, and sends emoji to correct it. The reward is terminal only.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emoji_rl.config import override
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI, parse_message
from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.play.batching import MicroBatcher
from emoji_rl.play.chat import ChatEnv
from emoji_rl.play.guessing import Guess, JudgeInput
from emoji_rl.play.judge import Judge
from emoji_rl.play.reward import RewardWeights, terminal_reward
from emoji_rl.play.similarity import Background, GuessScorer, Similarity
from emoji_rl.play.spec import GameConfig
from emoji_rl.play.types import StepResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_TURNS = 5
TAU = 0.85
SUCCESS_THRESHOLDS = (0.5, 0.65, 0.7, TAU)


@dataclass
class RetrievalConfig(GameConfig):
    """The retrieval game's length and success threshold, in every stage that plays it."""

    max_turns: int = override(GameConfig, "max_turns", MAX_TURNS, help="sender turns before the game ends")
    tau: float = field(
        default=TAU,
        metadata={
            "help": "similarity that ends the game as a success (a cosine similarity, so in [-1, 1]: "
            "above 1 no game succeeds)",
            "min": -1.0,
            "max": 1.0,
        },
    )


AskJudge = Callable[[JudgeInput], Awaitable[Guess]]
# (similarity to the target, mean similarity to other messages: 0 without a Background)
Score = Callable[[tuple[str, str]], Awaitable[tuple[float, float]]]


@dataclass(frozen=True)
class RetrievalRules:
    """The game's settings, the same for every episode of a run."""

    max_turns: int = MAX_TURNS
    tau: float = TAU
    min_emoji: int = MIN_EMOJI
    max_emoji: int = MAX_EMOJI
    weights: RewardWeights = field(default_factory=RewardWeights)


class RetrievalEnv(ChatEnv):
    """One episode for one target message. `ask_judge` and `score` are shared, batched services."""

    def __init__(
        self,
        target: str,
        tokenizer: PreTrainedTokenizerBase,
        ask_judge: AskJudge,
        score: Score,
        rules: RetrievalRules,
    ) -> None:
        super().__init__(tokenizer, sender_messages(target))
        self.target = target
        self.ask_judge = ask_judge
        self.score = score
        self.rules = rules
        self.turns: list[tuple[str, ...]] = []
        self.guesses: list[Guess] = []
        self.similarities: list[float] = []
        self.backgrounds: list[float] = []

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        # 1. parse: what the sender wrote, up to its end-of-turn token
        text, ended = self.read(action_ids)
        parsed = parse_message(text, self.rules.min_emoji, self.rules.max_emoji)
        self.turns.append(parsed.emoji)
        if not (ended and parsed.ok):
            reason = parsed.reason or "the turn did not end within the token budget"
            return self._finish(violation=True, log={"emoji": text, "violation": reason})
        # 2. ask the judge, which sees every emoji turn and its own earlier guesses
        guess = await self.ask_judge(JudgeInput(tuple(self.turns), tuple(g.text for g in self.guesses)))
        # 3. score the guess against the target
        similarity, background = await self.score((self.target, guess.text))
        # 4. append history; the game ends at tau or at the last turn
        self.guesses.append(guess)
        self.similarities.append(similarity)
        self.backgrounds.append(background)
        log = {"emoji": text, "guess": guess.text, "judge_raw": guess.raw}
        if similarity >= self.rules.tau or len(self.turns) == self.rules.max_turns:
            return self._finish(violation=False, log=log)
        observation = self.reply(text, action_ids, correction_message(guess.text, self.target))
        metrics = {"similarity": similarity}
        return StepResult(done=False, reward=0.0, next_observation_ids=observation, metrics=metrics, log=log)

    def _finish(self, violation: bool, log: dict[str, str]) -> StepResult:
        final = self.similarities[-1] if self.similarities else 0.0
        sent = [e for turn in self.turns for e in turn]
        terms = terminal_reward(
            similarity=final,
            turns=len(self.turns),
            violation=violation,
            unique_emoji=len(set(sent)),
            total_emoji=len(sent),
            tau=self.rules.tau,
            weights=self.rules.weights,
            background=self.backgrounds[-1] if self.backgrounds else 0.0,
        )
        metrics = {
            "similarity": final,
            "turns": float(len(self.turns)),
            "format_violation": float(violation),
            "judge_emoji_stripped": float(any(g.stripped_emoji for g in self.guesses)),
            **{f"success@{t}": float(final >= t) for t in SUCCESS_THRESHOLDS},
            **{f"reward/{name}": value for name, value in terms.items()},
        }
        return StepResult(done=True, reward=terms["total"], metrics=metrics, log=log)


class RetrievalBuilder:
    """Builds one game per target, all sharing one judge and one embedder through micro-batchers, so
    the B x G games of a step make one judge call and one embedding call per turn."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        judge: Judge,
        similarity: Similarity,
        rules: RetrievalRules,
        background: Background | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.judge = judge
        self.similarity = similarity
        self.rules = rules
        self.judge_seconds = 0.0
        self._ask_judge: MicroBatcher[JudgeInput, Guess] = MicroBatcher(self._judge_batch)
        self._score = GuessScorer(similarity, background)

    @property
    def seconds(self) -> dict[str, float]:
        """Spent in the judge and in scoring since the start."""
        return {"judge": self.judge_seconds, "similarity": self._score.seconds}

    async def _judge_batch(self, inputs: Sequence[JudgeInput]) -> list[Guess]:
        start = time.perf_counter()
        guesses = await self.judge.guess(inputs)
        self.judge_seconds += time.perf_counter() - start
        return guesses

    def __call__(self, record: dict[str, str]) -> RetrievalEnv:
        return RetrievalEnv(record["target"], self.tokenizer, self._ask_judge, self._score, self.rules)
