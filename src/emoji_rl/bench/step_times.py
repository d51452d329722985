"""A GRPO run's step times from its metrics.jsonl, as `make bench`'s overlap rows compare them:
medians after a warm-up, the rollouts' and the update's shares of the step, and K = 1 against
lockstep."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

WARMUP = 2


@dataclass(frozen=True)
class StepTimes:
    """Medians over a run's steps after the warm-up, in seconds."""

    rollout: float
    update: float
    wait: float
    step: float
    steps: int

    @property
    def rollout_share(self) -> float:
        return self.rollout / self.step

    @property
    def update_share(self) -> float:
        return self.update / self.step

    def balanced(self, low: float = 0.4, high: float = 0.6) -> bool:
        """Whether the rollouts and the update each take `low`-`high` of the step (the issue's shape)."""
        return all(low <= share <= high for share in (self.rollout_share, self.update_share))


def step_times(metrics: Sequence[dict[str, float]], warmup: int = WARMUP) -> StepTimes:
    """The medians of `time/rollout_s`, `time/update_s`, `time/wait_rollouts_s` and `time/step_s` over
    the steps after the first `warmup`."""
    kept = [m for m in sorted(metrics, key=lambda m: m["step"]) if m["step"] > warmup]
    if not kept:
        raise ValueError(f"no steps after the {warmup} of warm-up: {len(metrics)} steps in all")

    def median(key: str) -> float:
        return statistics.median(m[key] for m in kept)

    return StepTimes(
        median("time/rollout_s"),
        median("time/update_s"),
        median("time/wait_rollouts_s"),
        median("time/step_s"),
        len(kept),
    )


def overlap_ratios(lockstep: StepTimes, ahead: StepTimes) -> tuple[float, float]:
    """K = 1's step over lockstep's, and over the slower side of lockstep (rollouts or update)."""
    return ahead.step / lockstep.step, ahead.step / max(lockstep.rollout, lockstep.update)


def describe(label: str, times: StepTimes) -> str:
    return (
        f"  {label}: step {times.step:.2f} s, rollout {times.rollout:.2f} s ({times.rollout_share:.0%}), "
        f"update {times.update:.2f} s ({times.update_share:.0%}), waited {times.wait:.2f} s "
        f"(medians of {times.steps} steps)"
    )


def balancing_padding(bare: StepTimes, padded: StepTimes, probe: int, limit: int) -> int:
    """The padding (words added to each prompt) at which lockstep's rollouts and update take equal
    time, from two lockstep runs: `bare` with none and `padded` with `probe` words. Both sides are
    taken as linear in the padding between them (the update trains through every prompt token, the
    rollouts read a group's shared prompt once), clamped to [0, limit]. 0 when padding cannot help:
    the update already takes at least half of the bare step, or grows no faster than the rollouts."""
    gap = bare.rollout - bare.update
    closing = (padded.update - bare.update) - (padded.rollout - bare.rollout)
    if gap <= 0 or closing <= 0:
        return 0
    return min(limit, round(probe * gap / closing))
