"""What every selftest check shares: its result, the registry the checks add themselves to, the
options, and the comparisons and device helpers more than one check uses."""

from __future__ import annotations

import importlib.util
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from emoji_rl.lm import models

Status = Literal["PASS", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Result:
    status: Status
    figure: str
    """What was measured, or why the check failed or was skipped: one line."""
    details: dict[str, str] = field(default_factory=dict)


class Skipped(Exception):
    """Raised by a check that cannot run here: the message says why."""


@dataclass
class Config:
    """Check this machine's stack on small random models at Qwen3.5-4B's real shapes: PASS/FAIL/SKIP table."""

    output_dir: str = field(
        default="reports/selftest",
        metadata={"help": "where selftest.json and selftest.md are written", "aliases": ("out_dir",)},
    )
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto", metadata={"help": "auto: CUDA when torch sees it, else the CPU"}
    )
    only: list[str] | None = field(
        default=None,
        metadata={
            "help": "run these checks only, by the names in the table (docs/gpu/SELFTEST.md lists them)"
        },
    )
    check_seconds: float = field(
        default=300.0,
        metadata={"help": "time bound of each check; past it the check FAILs (read between Python calls)"},
    )
    sampling_draws: int = field(
        default=1_000_000, metadata={"help": "draws of the grammar-sampling check, counting masked ids"}
    )
    sampling_seconds: float = field(
        default=20.0,
        metadata={"help": "stop drawing after this long, saying how many were made (a CPU: ~100 a second)"},
    )

    def __post_init__(self) -> None:
        unknown = sorted(set(self.only or ()) - set(CHECKS))
        if unknown:
            raise ValueError(f"only: unknown check(s) {', '.join(unknown)}; the checks: {', '.join(CHECKS)}")
        if self.check_seconds <= 0 or self.sampling_seconds <= 0 or self.sampling_draws < 1:
            raise ValueError("check_seconds, sampling_seconds and sampling_draws must be positive")


Check = Callable[[Config, models.Runtime], Result]
# Filled as the check modules are imported (the package imports them all, in the table's order).
CHECKS: dict[str, Check] = {}


def check(name: str) -> Callable[[Check], Check]:
    def register(function: Check) -> Check:
        CHECKS[name] = function
        return function

    return register


def last_line(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(err)).strip().splitlines()[-1]


def need_module(module: str, what: str) -> None:
    """Skipped when `module` is not installed at all (the selftest wheels leave it out); an installed
    one that fails to import is the check's FAIL, raised where it is imported."""
    if importlib.util.find_spec(module) is None:
        raise Skipped(
            f"{module} is not installed: {what} needs the project's own install (`make setup`), "
            "which the selftest wheels leave out (docs/gpu/SELFTEST.md)"
        )


def is_cuda(runtime: models.Runtime) -> bool:
    return runtime.device.startswith("cuda")


def need_cuda(runtime: models.Runtime) -> None:
    if not is_cuda(runtime):
        raise Skipped("no CUDA" if not torch.cuda.is_available() else "--device cpu")


def sync(runtime: models.Runtime) -> None:
    if is_cuda(runtime):
        torch.cuda.synchronize()


def timed_ms(runtime: models.Runtime, work: Callable[[], object]) -> float:
    sync(runtime)
    start = time.perf_counter()
    work()
    sync(runtime)
    return (time.perf_counter() - start) * 1000


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    want = want.float()
    return ((got.float() - want).norm() / want.norm().clamp_min(1e-30)).item()


def verdict(errors: dict[str, float], tolerances: dict[str, float], what: str) -> Result:
    """PASS when every error is within its tolerance (NaN is not); the figure names the worst."""
    over = {k: e for k, e in errors.items() if not e <= tolerances[k]}
    details = {k: f"{e:.2e} (tolerance {tolerances[k]:g})" for k, e in errors.items()}
    worst = max(errors, key=lambda k: errors[k] / tolerances[k] if math.isfinite(errors[k]) else math.inf)
    figure = f"{what}; worst {worst} {errors[worst]:.2e} of {tolerances[worst]:g}"
    if over:
        return Result("FAIL", f"{figure}; over tolerance: {', '.join(over)}", details)
    return Result("PASS", figure, details)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
