"""Wordle's reward: weighted terms of a finished episode (docs/DESIGN.md §9, seed 003), and the curriculum
that moves weight from format to strategy once the format is learned (seed 003 §14).

The reward is terminal, like the retrieval game's: the trainer gives one advantage per episode from
the last StepResult. Per-turn terms (format, five letters, consistency, feedback use, information,
repeats) are averaged over the turns played, not summed, so dragging a game out never earns more
shaping than winning it early.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, fields

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WordleWeights:
    """Weight of each term; a term's value before weighting is in [0, 1] (feedback use in [-1, 1])."""

    correct: float = 1.0
    """[solved]."""
    early: float = 1.0
    """1/turns when solved: a win in 2 beats a win in 6."""
    format: float = 0.2
    """Share of turns in the strict `<think>…</think><guess>word</guess>` format."""
    consistency: float = 0.5
    """Share of turns whose guess agrees with all feedback so far (could still be the answer)."""
    length: float = 0.1
    """Share of turns whose guess is five letters."""
    feedback_use: float = 0.2
    """Mean of seed 003's per-letter feedback score over turns 2..T (turn 1 has no feedback)."""
    info_gain: float = 0.2
    """Mean expected entropy reduction over the remaining candidates, as a share of what is left."""
    repeat: float = 0.5
    """Subtracted times the share of turns that repeat an earlier guess (seed 003: "THINK" x 5)."""


TERMS = tuple(f.name for f in fields(WordleWeights))


@dataclass(frozen=True)
class TurnScore:
    """One turn's raw term values; `guess` is None when no word could be read."""

    guess: str | None
    strict_format: bool
    five_letters: bool
    consistent: bool
    feedback_use: float | None
    """None on turn 1 or for an unreadable guess: there was nothing to use or nothing to score."""
    info: float
    repeated: bool


def episode_terms(turns: list[TurnScore], solved: bool, weights: WordleWeights) -> dict[str, float]:
    """The weighted terms of a finished episode and their sum, `total`."""
    assert turns, "an episode has at least one turn"
    n = len(turns)
    used = [t.feedback_use for t in turns if t.feedback_use is not None]
    raw = {
        "correct": float(solved),
        "early": 1.0 / n if solved else 0.0,
        "format": sum(t.strict_format for t in turns) / n,
        "consistency": sum(t.consistent for t in turns) / n,
        "length": sum(t.five_letters for t in turns) / n,
        "feedback_use": sum(used) / len(used) if used else 0.0,
        "info_gain": sum(t.info for t in turns) / n,
        "repeat": -sum(t.repeated for t in turns) / n,
    }
    terms = {name: getattr(weights, name) * value for name, value in raw.items()}
    return {**terms, "total": sum(terms.values())}


FORMAT_PHASE = WordleWeights()
# Seed 003 §14, phase 2: format 1.0 -> 0.3 of its weight, feedback and value up, repeats -1.0.
STRATEGY_PHASE = WordleWeights(
    format=0.06, length=0.03, consistency=1.0, feedback_use=0.5, info_gain=0.5, repeat=1.0
)


@dataclass(frozen=True)
class Curriculum:
    """Phases of reward weights; the next phase starts once format compliance over the last `window`
    episodes reaches `threshold`. Pure: `next_phase` maps (phase, compliance) to a phase."""

    phases: tuple[WordleWeights, ...] = (FORMAT_PHASE, STRATEGY_PHASE)
    threshold: float = 0.9
    window: int = 64

    def next_phase(self, phase: int, compliance: float) -> int:
        return min(phase + 1, len(self.phases) - 1) if compliance >= self.threshold else phase


class CurriculumTracker:
    """The curriculum's state in a run: the current phase and the strict-format flags of recent episodes.

    The trainer feeds it (`GameSetup.observe`) every process's episodes of a step, in rank order, once
    the step's rollouts are gathered: each process holds the same window and takes the same
    decisions, so the main process's checkpoint (`state_dict`) is every process's, and a resumed run
    goes on in the phase it had reached. The phase only advances, and the weights a game uses are
    fixed when it is built, so the G games of a group share them.
    """

    def __init__(self, curriculum: Curriculum) -> None:
        self.curriculum = curriculum
        self.phase = 0
        self._recent: deque[float] = deque(maxlen=curriculum.window)

    @property
    def weights(self) -> WordleWeights:
        return self.curriculum.phases[self.phase]

    def record(self, format_share: float) -> None:
        self._recent.append(format_share)
        if len(self._recent) < self.curriculum.window:
            return
        compliance = sum(self._recent) / len(self._recent)
        phase = self.curriculum.next_phase(self.phase, compliance)
        if phase != self.phase:
            log.info(
                "wordle curriculum: phase %d -> %d (format compliance %.2f over %d episodes >= %.2f): %s",
                self.phase,
                phase,
                compliance,
                len(self._recent),
                self.curriculum.threshold,
                self.curriculum.phases[phase],
            )
            self.phase = phase
            self._recent.clear()

    def state_dict(self) -> dict[str, object]:
        return {"phase": self.phase, "recent": list(self._recent)}

    def load_state_dict(self, state: dict[str, object]) -> None:
        phase, recent = state["phase"], state["recent"]
        assert isinstance(phase, int) and 0 <= phase < len(self.curriculum.phases), state
        assert isinstance(recent, list), state
        self.phase = phase
        # A changed curriculum_window keeps the newest flags that fit.
        self._recent = deque(recent, maxlen=self.curriculum.window)
