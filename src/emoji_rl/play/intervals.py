"""The bootstrap intervals every evaluation reports its means and differences with, and the verdict
an interval gives. Pure functions; no model, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Interval:
    """A mean and its percentile-bootstrap interval; `low` and `high` are None for fewer than two
    values, where there is no spread to resample."""

    mean: float
    low: float | None
    high: float | None


def verdict(low: float | None, high: float | None) -> str:
    """Where an interval lies against 0: what a difference says."""
    if low is not None and low > 0:
        return "above 0"
    if high is not None and high < 0:
        return "below 0"
    return "includes 0"


def _percentile_interval(values: np.ndarray, n_resamples: int, seed: int, confidence: float) -> Interval:
    assert len(values) >= 1, "an interval needs at least one value"
    assert 0 < confidence < 1 and n_resamples >= 1, (confidence, n_resamples)
    mean = float(values.mean())
    if len(values) < 2:
        return Interval(mean, None, None)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_resamples, len(values)))].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Interval(mean, float(low), float(high))


def bootstrap_mean(
    values: Sequence[float], n_resamples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """The mean of `values` with its percentile-bootstrap interval (values resampled with replacement)."""
    return _percentile_interval(np.asarray(values, dtype=float), n_resamples, seed, confidence)


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    n_resamples: int = 2000,
    seed: int = 0,
    confidence: float = 0.95,
) -> Interval:
    """mean(a - b) with its percentile-bootstrap interval, `a[i]` and `b[i]` measured on the same item i
    and resampled together: what the items share (an easy message is easy for every system) cancels,
    so the interval is the difference's, far narrower than two separate intervals suggest."""
    assert len(a) == len(b), (len(a), len(b))
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return _percentile_interval(diffs, n_resamples, seed, confidence)
