"""What holds each GPU of this machine, as nvidia-smi reports it: the launchers ask before they start a
trainer, so that it does not take GPUs a vLLM server (or anything else) already fills and run out of
memory at load or at its first step.

A GPU is taken when nvidia-smi lists a compute process on it, or when more than `BUSY_MIB` of its
memory is in use (a process of another container, which nvidia-smi does not show). The ids are
nvidia-smi's indices, which are CUDA's device ids under CUDA_DEVICE_ORDER=PCI_BUS_ID, and on a box of
one GPU model in any order.

    python -m emoji_rl.io.nvidia_smi --gpus all --for launch/train_sft.sh       # exit 2, naming them
    python -m emoji_rl.io.nvidia_smi --gpus 4,5,6,7 --for launch/train_grpo.sh
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

GPU_QUERY = ("--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits")
APP_QUERY = ("--query-compute-apps=gpu_uuid,pid,process_name,used_memory", "--format=csv,noheader,nounits")
BUSY_MIB = 1024
"""Memory in use above which a GPU with no process listed is taken: an idle card holds a few MiB."""


@dataclass(frozen=True)
class Gpu:
    index: str
    uuid: str
    used_mib: int
    total_mib: int


@dataclass(frozen=True)
class App:
    """A compute process on a GPU."""

    gpu_uuid: str
    pid: int
    name: str
    used_mib: int | None
    """None where nvidia-smi cannot say ([N/A], [Insufficient Permissions])."""


def _rows(text: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]


def _mib(cell: str) -> int | None:
    return int(cell) if cell.isdigit() else None


def parse_gpus(text: str) -> list[Gpu]:
    """`nvidia-smi` GPU_QUERY's output."""
    return [Gpu(index, uuid, _mib(used) or 0, _mib(total) or 0) for index, uuid, used, total in _rows(text)]


def parse_apps(text: str) -> list[App]:
    """`nvidia-smi` APP_QUERY's output (a process name may hold commas: it is the middle cells)."""
    return [App(row[0], int(row[1]), ", ".join(row[2:-1]), _mib(row[-1])) for row in _rows(text)]


def taken(
    gpus: Sequence[Gpu], apps: Sequence[App], wanted: Sequence[str] | None
) -> list[tuple[Gpu, list[App]]]:
    """The GPUs of `wanted` (None: all) that are taken, each with the processes nvidia-smi shows there."""
    out = []
    for gpu in gpus:
        if wanted is not None and gpu.index not in wanted:
            continue
        there = [app for app in apps if app.gpu_uuid == gpu.uuid]
        if there or gpu.used_mib > BUSY_MIB:
            out.append((gpu, there))
    return out


def refusal(who: str, busy: Sequence[tuple[Gpu, list[App]]], free: Sequence[str]) -> str:
    """What a launcher says when it would start on taken GPUs: each GPU, what holds it, and the way out
    (`free`: the GPUs nothing holds)."""

    def holder(app: App) -> str:
        memory = f": {app.used_mib:,} MiB" if app.used_mib is not None else ""
        return f"pid {app.pid} {app.name}{memory}"

    each = "; ".join(
        f"GPU {gpu.index}: {gpu.used_mib:,} of {gpu.total_mib:,} MiB in use"
        + (f" ({', '.join(map(holder, apps))})" if apps else " (by processes nvidia-smi does not show)")
        for gpu, apps in busy
    )
    way_out = (
        f"set TRAIN_GPUS to GPUs free now ({','.join(free)})" if free else "no GPU of this box is free now"
    )
    return (
        f"{who}: GPU {','.join(gpu.index for gpu, _ in busy)} already in use, where the trainer would run out "
        f"of memory: {each}. Stop those processes (servers started by make serve-judge or make "
        f"serve-policy: Ctrl-C in their shells), or {way_out}"
    )


def query(*args: str) -> str:
    return subprocess.run(
        ["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Exit 2, naming what holds them, if any of these GPUs is in use (nvidia-smi); 0 otherwise, "
        "and without nvidia-smi"
    )
    parser.add_argument(
        "--gpus", required=True, help="GPU ids separated by commas (CUDA_VISIBLE_DEVICES), or all"
    )
    parser.add_argument("--for", dest="who", default="this launch", help="who asks, for the message")
    args = parser.parse_args(argv)
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        gpus, apps = parse_gpus(query(*GPU_QUERY)), parse_apps(query(*APP_QUERY))
    except (subprocess.SubprocessError, OSError, ValueError) as err:
        # The GPUs cannot be read, not seen taken: the launch goes on, as without this check.
        print(
            f"{args.who}: nvidia-smi could not say which GPUs are in use ({err}); not checked",
            file=sys.stderr,
        )
        return 0
    busy = taken(gpus, apps, None if args.gpus == "all" else args.gpus.split(","))
    if busy:
        held = {gpu.index for gpu, _ in taken(gpus, apps, None)}
        print(refusal(args.who, busy, [gpu.index for gpu in gpus if gpu.index not in held]), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
