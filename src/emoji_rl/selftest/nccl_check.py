"""A lost NCCL peer on one GPU, for the first GPU this project is lent (launch/gpu_nccl_check.sh): does a
failed collective reach Python, how long after, and does the process then end, with our settings
(lm/processes.py's NCCL_ENV: CleanUpOnly, no flight-recorder dump) and with torch's dump on?

A process group of one process (world size 1) on GPU 0 queues an all_reduce behind `torch.cuda._sleep`,
which keeps the GPU busy past the collective's timeout (`--timeout_s`, 10 s): its watchdog sees the
collective time out, as it sees one whose peer is gone. Then, read from torch's ProcessGroupNCCL.cpp
(Watchdog::runLoop, HeartbeatMonitor::runLoop):

- the watchdog sleeps 4 x TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC (15 s: 60 s) whether or not anything
  dumps, then (CleanUpOnly) aborts the communicators: the next collective raises DistBackendError;
- with TORCH_NCCL_DUMP_ON_TIMEOUT=1 (torch's default), PG 0's heartbeat monitor also dumps the flight
  recorder, then sleeps TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC (480 s; `--heartbeat_s` here, so that the
  check fits in minutes) and aborts the process (SIGABRT), unless the process group's destructor has
  stopped it first, which joins it: the exit waits out the sleep. With 0 the monitor is woken at exit.

Each variant runs in a process of its own (`--child VARIANT`), which prints when its collective failed
and then exits as a stage does; this parent times both and prints PASS or FAIL per variant:

    python -m emoji_rl.selftest.nccl_check                 # both variants, under 6 minutes
    python -m emoji_rl.selftest.nccl_check --child ours    # one, in this process (what the parent runs)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from emoji_rl.lm.processes import NCCL_ENV

VARIANTS = ("ours", "dump")
RAISE_SLACK_S = 30.0
"""How much later than timeout + the watchdog's 60 s the error may reach Python."""
PROMPT_EXIT_S = 15.0
"""An exit that takes longer than this after the error is held up."""


def variant_env(variant: str, heartbeat_s: int) -> dict[str, str]:
    """The environment of a variant's process: ours, or ours with torch's dump on (a trace to dump,
    and the heartbeat monitor's sleep shortened to `heartbeat_s`)."""
    if variant == "ours":
        return dict(NCCL_ENV)
    return {
        **NCCL_ENV,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(heartbeat_s),
    }


@dataclass(frozen=True)
class Measured:
    raised_s: float | None
    """From the collective's enqueue to DistBackendError in Python (None: it never came)."""
    exit_s: float | None
    """From that error to the process's end (None: killed by the parent's limit)."""
    returncode: int | None


def verdict(variant: str, measured: Measured, timeout_s: float, heartbeat_s: int) -> tuple[bool, str]:
    """Whether `measured` is what the reading of ProcessGroupNCCL.cpp expects, and the figures."""
    expected = timeout_s + 60
    if measured.raised_s is None:
        return False, f"no error reached Python (expected at about {expected:.0f} s)"
    figures = f"the error after {measured.raised_s:.0f} s (expected about {expected:.0f} s)"
    if measured.raised_s > expected + RAISE_SLACK_S:
        return False, figures + ": later than the watchdog's pause explains"
    if measured.exit_s is None:
        return False, figures + ", then the process never ended"
    figures += f", the exit {measured.exit_s:.0f} s after it (returncode {measured.returncode})"
    if variant == "ours":
        return measured.exit_s <= PROMPT_EXIT_S, figures + f"; expected within {PROMPT_EXIT_S:.0f} s"
    held = measured.exit_s >= heartbeat_s - PROMPT_EXIT_S or measured.returncode == -6
    return held, figures + f"; expected held about {heartbeat_s} s (the monitor's sleep) or SIGABRT"


def child(timeout_s: float) -> int:
    """One variant, in this process: its environment is set by the parent before torch reads it."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("nccl_check: needs a CUDA GPU (NCCL)", file=sys.stderr)
        return 2
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl", rank=0, world_size=1, timeout=timedelta(seconds=timeout_s), device_id=device
    )
    x = torch.ones(1, device=device)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    # GPU cycles a second, measured: _sleep counts clock cycles.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**8)
    end.record()
    end.synchronize()
    per_s = 10**8 / (start.elapsed_time(end) / 1000)
    # Busy past the timeout and the watchdog's pause, not much longer: the exit is not its wait.
    torch.cuda._sleep(int(per_s * (timeout_s + 70)))
    queued = time.monotonic()
    dist.all_reduce(x, async_op=True)
    while time.monotonic() - queued < timeout_s + 60 + RAISE_SLACK_S:
        time.sleep(1)
        try:
            dist.all_reduce(torch.ones(1, device=device), async_op=True)
        except RuntimeError as err:  # DistBackendError
            line = str(err).strip().splitlines()[0][:300]
            print(json.dumps({"raised_s": time.monotonic() - queued, "error": line}), flush=True)
            return 1  # and the interpreter exits as a stage's does
    return 3


def run_variant(variant: str, args: argparse.Namespace) -> Measured:
    env = {**os.environ, **variant_env(variant, args.heartbeat_s)}
    command = [
        sys.executable,
        "-m",
        "emoji_rl.selftest.nccl_check",
        "--child",
        variant,
        "--timeout_s",
        str(args.timeout_s),
    ]
    limit = args.timeout_s + 60 + RAISE_SLACK_S + args.heartbeat_s + 60
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    raised = raised_at = None
    deadline = time.monotonic() + limit
    for line in process.stdout:  # type: ignore[union-attr]
        if line.startswith("{"):
            raised, raised_at = json.loads(line), time.monotonic()
            print(f"  {variant}: {raised['error']}", flush=True)
            break
    try:
        process.wait(timeout=max(1.0, deadline - time.monotonic()))
        exit_s = time.monotonic() - raised_at if raised_at is not None else None
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        exit_s = None
    return Measured(raised["raised_s"] if raised else None, exit_s, process.returncode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", choices=VARIANTS, help="run one variant in this process (the parent does)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--timeout_s", type=float, default=10.0, help="the collective's timeout (default 10)")
    parser.add_argument(
        "--heartbeat_s", type=int, default=60,
        help="TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC of the dump variant (default 60; torch's is 480)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.child:
        return child(args.timeout_s)
    failed = 0
    for variant in args.variants:
        passed, text = verdict(variant, run_variant(variant, args), args.timeout_s, args.heartbeat_s)
        print(f"nccl_check {variant:<5} {'PASS' if passed else 'FAIL'}: {text}", flush=True)
        failed += not passed
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
