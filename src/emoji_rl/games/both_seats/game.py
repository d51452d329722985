"""Both seats (docs/DESIGN.md §15): the policy writes emoji for a message (the sender's chat, under the
grammar) and reads them back (the reader's: the judge's guessing chat, free text), while the frozen
judge reads the same emoji. Each round is the sender's turn, then the reader's; a round whose judge
guess falls short of `tau` asks the sender again, showing it the judge's guess, as the retrieval game
does: the judge's guess decides, so the sender corrects what an outsider misread, never only what its
own reader did. The game ends at `tau` or after `max_turns` rounds, or after a round whose message was
not one (cut off by the token budget: the reader still reads what was sent, then it ends).

On a record the teacher has emoji for, drawn into `teacher_share` of the records (by its id, the same
every epoch and on every process), the reader reads the teacher's emoji in round 1 (then the sender's
corrections): so it keeps reading an outside code. There the sender is paid by the judge alone.

Rewards are terminal, one per seat. The sender's is the retrieval game's (`play/reward.terminal_reward`)
on the mix judge_weight x the judge's similarity + (1 - judge_weight) x the reader's, both of the last
round the message was valid in (their backgrounds mixed alike); the reader's is its final guess's
similarity less the contrast term (`reader_reward`, the reader game's).
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emoji_rl.config import override
from emoji_rl.emoji.alphabet import SEPARATOR, parse_message
from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.play.batching import MicroBatcher
from emoji_rl.play.chat import Chat
from emoji_rl.play.guessing import UNKNOWN, Guess, JudgeInput, JudgeView, clean_guess, judge_messages
from emoji_rl.play.judge import Judge
from emoji_rl.play.reward import RewardWeights, reader_reward, terminal_reward
from emoji_rl.play.similarity import GuessScorer
from emoji_rl.play.spec import GameConfig
from emoji_rl.play.types import Env, Record, Seat, StepResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SENDER = Seat("sender", "grammar")
READER = Seat("reader", "none")
TEACHER = "teacher_emoji"
"""A record's field holding the teacher's emoji for its target, a list (spec.py's read_records adds it)."""
MAX_TURNS = 5
TAU = 0.85
SUCCESS_THRESHOLDS = (0.5, 0.65, 0.7, TAU)


@dataclass
class BothSeatsConfig(GameConfig):
    """The game's length, what decides it, and how the sender's reward weighs its two readers."""

    max_turns: int = override(GameConfig, "max_turns", MAX_TURNS, help="rounds (a message, two guesses)")
    tau: float = field(default=TAU, metadata={"help": "the judge's similarity that ends the game"})
    judge_weight: float = field(
        default=0.75,
        metadata={
            "help": "the frozen judge's share of the sender's similarity, the policy's reader the rest: at "
            "least 0.5 keeps the code readable to an outsider (docs/DESIGN.md §15); 1: the sender is "
            "paid as the retrieval game pays it",
            "min": 0.0,
        },
    )
    teacher_share: float = field(
        default=0.25,
        metadata={
            "help": "share of the records (those the teacher has emoji for: teacher_data) whose first "
            "reading is of the teacher's emoji, not the sender's",
            "min": 0.0,
        },
    )
    teacher_data: str | None = field(
        default=None,
        metadata={
            "help": "an SFT split (`emoji-rl teacher`'s sft_train.jsonl) whose teacher emoji are looked up by "
            "target; none: every reading is of the sender's emoji",
            "input": True,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0.0 <= self.judge_weight <= 1.0 and 0.0 <= self.teacher_share <= 1.0):
            raise ValueError(
                f"judge_weight={self.judge_weight} and teacher_share={self.teacher_share} must be in [0, 1]"
            )


@dataclass(frozen=True)
class BothSeatsRules:
    """The game's settings, the same for every episode of a run."""

    max_turns: int = MAX_TURNS
    tau: float = TAU
    min_emoji: int = 2
    max_emoji: int = 8
    judge_weight: float = 0.75
    view: JudgeView = "gloss"
    weights: RewardWeights = field(default_factory=RewardWeights)


Score = Callable[[tuple[str, str]], Awaitable[tuple[float, float]]]


@dataclass
class Reading:
    """One guess of the message: its similarity and background (`GuessScorer`)."""

    guess: Guess
    similarity: float
    background: float


class BothSeatsEnv(Env):
    """One episode for one message; `teacher`: the emoji the reader reads first instead of the
    sender's (None: the sender's). `ask_judge` and `score` are shared, batched services."""

    def __init__(
        self,
        target: str,
        tokenizer: PreTrainedTokenizerBase,
        ask_judge: Callable[[JudgeInput], Awaitable[Guess]],
        score: Score,
        rules: BothSeatsRules,
        teacher: tuple[str, ...] | None = None,
    ) -> None:
        self.target, self.rules, self.teacher = target, rules, teacher
        self.ask_judge, self.score = ask_judge, score
        self.sender = Chat(tokenizer, sender_messages(target))
        self.reader: Chat | None = None  # opens on the first emoji
        self.sent: list[tuple[str, ...]] = []  # the sender's messages, the judge's turns
        self.shown: list[tuple[str, ...]] = []  # what the reader read each round
        self.judged: list[Reading] = []
        self.read_back: list[Reading] = []
        self.valid_rounds = 0  # rounds whose message both read (the last one counts for the sender)
        self.violation = ""
        self.cut_off = 0
        self.last: dict[str, tuple[str, tuple[int, ...]]] = {}  # each seat's last turn (text, ids)
        self.seat = SENDER

    async def start(self) -> tuple[int, ...]:
        return self.sender.opening_ids()

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        if self.seat is SENDER:
            return await self._sent(action_ids)
        return await self._read(action_ids)

    async def _sent(self, action_ids: tuple[int, ...]) -> StepResult:
        # 1. parse the sender's message
        text, ended = self.sender.read(action_ids)
        self.last["sender"] = (text, action_ids)
        parsed = parse_message(text, self.rules.min_emoji, self.rules.max_emoji)
        self.sent.append(parsed.emoji)
        log = {"emoji": text}
        if ended and parsed.ok:
            # 2. the judge reads every message so far, beside its own earlier guesses
            guesses = tuple(r.guess.text for r in self.judged)
            guess = await self.ask_judge(JudgeInput(tuple(self.sent), guesses))
            self.judged.append(Reading(guess, *await self.score((self.target, guess.text))))
            log |= {"judge_guess": guess.text, "judge_raw": guess.raw}
        else:
            self.violation = parsed.reason or "the turn did not end within the token budget"
            log["violation"] = self.violation
        # 3. the reader's turn: the teacher's emoji first on a teacher record, else what was sent
        first = not self.shown
        self.shown.append(self.teacher if first and self.teacher is not None else parsed.emoji)
        self.seat = READER
        message = judge_messages(self._reader_input(), self.rules.view)
        if first:
            self.reader = Chat(self.sender.tokenizer, message)
            observation = self.reader.opening_ids()
        else:
            assert self.reader is not None
            observation = self.reader.reply(*self.last["reader"], message[-1])
        return StepResult(False, 0.0, observation, log=log)

    async def _read(self, action_ids: tuple[int, ...]) -> StepResult:
        # 4. the reader's guess, cleaned as the judge's are, scored against the message
        assert self.reader is not None
        text, ended = self.reader.read(action_ids)
        self.last["reader"] = (text, action_ids)
        self.cut_off += not ended
        guess = clean_guess(text)
        self.read_back.append(Reading(guess, *await self.score((self.target, guess.text))))
        self.valid_rounds += not self.violation
        log = {"emoji": SEPARATOR.join(self.shown[-1]), "guess": guess.text, "reader_raw": text}
        judge = self.judged[-1].similarity if self.judged else 0.0
        if self.violation or judge >= self.rules.tau or len(self.sent) == self.rules.max_turns:
            return self._finish(log)
        # 5. the sender sees the judge's guess and corrects it
        self.seat = SENDER
        observation = self.sender.reply(
            *self.last["sender"], correction_message(self.judged[-1].guess.text, self.target)
        )
        return StepResult(False, 0.0, observation, metrics={"judge_similarity": judge}, log=log)

    def _reader_input(self) -> JudgeInput:
        return JudgeInput(tuple(self.shown), tuple(r.guess.text for r in self.read_back))

    def _finish(self, log: dict[str, str]) -> StepResult:
        rules = self.rules
        # The sender is paid for its last valid message, as both read it (nothing: it sent none).
        judge = self.judged[self.valid_rounds - 1] if self.valid_rounds else None
        pair = self.read_back[self.valid_rounds - 1] if self.valid_rounds else None
        weight = 1.0 if self.teacher is not None else rules.judge_weight
        similarity = weight * _similarity(judge) + (1 - weight) * _similarity(pair)
        background = weight * _background(judge) + (1 - weight) * _background(pair)
        emoji = [e for message in self.sent for e in message]
        sender = terminal_reward(
            similarity=similarity,
            turns=len(self.sent),
            violation=bool(self.violation),
            unique_emoji=len(set(emoji)),
            total_emoji=len(emoji),
            tau=rules.tau,
            weights=rules.weights,
            background=background,
        )
        final = self.read_back[-1]
        reader = reader_reward(final.similarity, final.background, rules.weights.contrast)
        read = "teacher" if self.teacher is not None else "pair"
        metrics = {
            "judge_similarity": _similarity(judge),
            "reader_similarity": final.similarity,
            # The pair and the drift on the emoji both read (the last valid round); the teacher's
            # reading, the reader's final guess.
            **({"pair_similarity": _similarity(pair)} if read == "pair" and pair else {}),
            **({"drift": _similarity(pair) - _similarity(judge)} if read == "pair" and judge else {}),
            **({"teacher_similarity": final.similarity} if read == "teacher" else {}),
            "turns": float(len(self.sent)),
            "format_violation": float(bool(self.violation)),
            "reader_cut_off": self.cut_off / len(self.read_back),
            # A reader that answers in emoji only (what an emoji SFT teaches a small model) says nothing:
            # its guess is [unknown] whatever it read, and its seat has no reward spread to learn from.
            "reader_unknown": float(final.guess.text == UNKNOWN),
            "judge_emoji_stripped": float(any(r.guess.stripped_emoji for r in self.judged)),
            "reader_emoji_stripped": float(any(r.guess.stripped_emoji for r in self.read_back)),
            **{f"success@{t}": float(_similarity(judge) >= t) for t in SUCCESS_THRESHOLDS},
            **{f"reward/sender/{name}": value for name, value in sender.items()},
            **{f"reward/reader/{name}": value for name, value in reader.items()},
        }
        rewards = {SENDER.name: sender["total"], READER.name: reader["total"]}
        return StepResult(True, sender["total"], metrics=metrics, log=log, seat_rewards=rewards)


def _similarity(reading: Reading | None) -> float:
    return reading.similarity if reading is not None else 0.0


def _background(reading: Reading | None) -> float:
    return reading.background if reading is not None else 0.0


def reads_teacher(record: Record, share: float, seed: int) -> bool:
    """Whether a record's first reading is of the teacher's emoji: a draw of its own (by seed and id,
    or target), so the same records every epoch, on every process and in a resumed run."""
    key = record.get("id") or record["target"]
    return random.Random(f"{seed}:{key}").random() < share


class BothSeatsBuilder:
    """Builds one game per record, all sharing one judge and one embedder through micro-batchers: the
    B x G games of a step make one judge call and one embedding call per turn."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        judge: Judge,
        score: GuessScorer,
        rules: BothSeatsRules,
        teacher_share: float,
        seed: int,
    ) -> None:
        self.tokenizer, self.judge, self.score, self.rules = tokenizer, judge, score, rules
        self.teacher_share, self.seed = teacher_share, seed
        self.judge_seconds = 0.0
        self._ask_judge: MicroBatcher[JudgeInput, Guess] = MicroBatcher(self._judge_batch)

    @property
    def seconds(self) -> dict[str, float]:
        """Spent in the judge and in scoring since the start."""
        return {"judge": self.judge_seconds, "similarity": self.score.seconds}

    async def _judge_batch(self, inputs: Sequence[JudgeInput]) -> list[Guess]:
        start = time.perf_counter()
        guesses = await self.judge.guess(inputs)
        self.judge_seconds += time.perf_counter() - start
        return guesses

    def teacher_for(self, record: Record, share: float) -> tuple[str, ...] | None:
        """The teacher's emoji the record's reader reads first (its TEACHER field), or None (the sender's)."""
        emoji = record.get(TEACHER)
        if emoji is None or not reads_teacher(record, share, self.seed):
            return None
        return tuple(emoji)

    def reading(self, share: float) -> Callable[[Record], BothSeatsEnv]:
        """A builder of the games on the same services, the teacher's emoji read on `share` of the
        records (0: none, 1: every record the teacher has emoji for)."""

        def build(record: Record) -> BothSeatsEnv:
            teacher = self.teacher_for(record, share)
            return BothSeatsEnv(
                record["target"], self.tokenizer, self._ask_judge, self.score, self.rules, teacher
            )

        return build

    def __call__(self, record: Record) -> BothSeatsEnv:
        return self.reading(self.teacher_share)(record)
