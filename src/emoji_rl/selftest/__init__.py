"""`emoji-rl selftest` (`make selftest`): does this machine's stack run the project's device paths?

The CUDA-only parts of the project (flash-linear-attention's Gated DeltaNet kernels, xgrammar's device
bitmask, sampling at the real vocabulary in bf16) are what no CPU test reaches. Each check here builds
what it needs from random weights at Qwen3.5-4B's real shapes and vocabulary (no download, no
network), runs timed and bounded, and ends PASS, FAIL (with the error's last line) or SKIP (with
why: "no CUDA" on a CPU). A table is printed and written as JSON and Markdown to `output_dir`; the exit
status is 1 when any check failed. docs/gpu/SELFTEST.md says what each check compares, and with
which tolerance.

    emoji-rl selftest                              # every check, on CUDA when it is there
    emoji-rl selftest --only environment grammar-bitmask
"""

from __future__ import annotations

import contextlib
import json
import logging
import platform
import signal
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import torch

from emoji_rl.errors import UserError
from emoji_rl.lm import models

# Each module adds its checks to CHECKS as it is imported: this order is the table's.
# isort: off
from emoji_rl.selftest import machine, kernels, stages, sizing  # noqa: F401

# isort: on
from emoji_rl.selftest.core import CHECKS, Config, Result, Skipped, Status, last_line

__all__ = ["CHECKS", "NOT_YET_CHECKED", "Config", "Row", "main", "markdown", "run_check", "table"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    seconds: float
    figure: str
    details: dict[str, str]


class CheckTimeout(Exception):
    pass


# What no check here reaches: listed in every report, so a table of PASS is not read as all of it.
NOT_YET_CHECKED = (
    "NCCL across processes and GPUs (the nccl check is one process; the multi-process launch is "
    "tests/test_fsdp.py's, on gloo)",
    "the vLLM engine and its LoRA loading (launch/vllm_engine, the tests marked vllm_engine)",
)


# --- running and reporting -------------------------------------------------------------------------


@contextlib.contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    """Raises CheckTimeout in the block after `seconds`. A signal is read between Python bytecodes,
    so one kernel or C call that never returns is not interrupted: the bound catches slow loops and
    waits, and the process's own timeout (the test's, make's) the rest."""

    def expire(signum: int, frame: object) -> None:
        raise CheckTimeout(f"still running after {seconds:g} s (--check_seconds)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_check(name: str, cfg: Config, runtime: models.Runtime) -> Row:
    start = time.perf_counter()
    try:
        with time_bound(cfg.check_seconds):
            result = CHECKS[name](cfg, runtime)
    except Skipped as why:
        result = Result("SKIP", str(why))
    except Exception as err:
        # The traceback goes to the log; the table keeps one line.
        log.warning("selftest %s failed", name, exc_info=True)
        result = Result("FAIL", last_line(err))
    return Row(name, result.status, time.perf_counter() - start, result.figure, result.details)


def table(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    lines = [f"{'check':<{width}}  status  seconds  figure"]
    lines += [f"{r.check:<{width}}  {r.status:<6}  {r.seconds:7.1f}  {r.figure}" for r in rows]
    return "\n".join(lines)


def markdown(rows: list[Row], header: dict[str, str]) -> str:
    out = ["# emoji-rl selftest", "", *(f"- {k}: {v}" for k, v in header.items()), ""]
    out += ["| check | status | seconds | figure |", "|---|---|---|---|"]
    out += [f"| {r.check} | {r.status} | {r.seconds:.1f} | {r.figure.replace('|', '/')} |" for r in rows]
    for r in rows:
        if r.details:
            out += ["", f"## {r.check}", "", *(f"- {k}: {v}" for k, v in r.details.items())]
    out += ["", "## Not yet checked", "", *(f"- {item}" for item in NOT_YET_CHECKED), ""]
    return "\n".join(out)


def main(cfg: Config) -> int:
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device cuda, but torch {torch.__version__} sees no CUDA device")
    runtime = models.pick_runtime(cfg.device)
    header = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()} ({platform.machine()}, {platform.python_version()})",
        "runtime": runtime.describe(),
    }
    rows = []
    for name in cfg.only or CHECKS:
        log.info("selftest: %s", name)
        rows.append(run_check(name, cfg, runtime))
    print(table(rows))
    print("not yet checked: " + "; ".join(NOT_YET_CHECKED))
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = {**header, "checks": [asdict(r) for r in rows], "not_yet_checked": list(NOT_YET_CHECKED)}
    (out / "selftest.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out / "selftest.md").write_text(markdown(rows, header))
    failed = [r.check for r in rows if r.status == "FAIL"]
    print(f"selftest: {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; report in {out}")
    return 1 if failed else 0
