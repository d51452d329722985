"""One line of `make bench`: what was measured, against what, the ratio and its goal. Its own
module, below the harness (`bench.py`) and every module that contributes rows (`rl/bench.py`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    measured: str
    baseline: str
    ratio: float
    goal: str
    met: bool
