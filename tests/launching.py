"""Launching a stage under `accelerate launch` over 2 CPU processes (gloo), as a GPU box runs it over
N GPUs, for the slow multi-process tests, and reading what the ranks wrote."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cli_args(settings: dict[str, object]) -> list[str]:
    return [
        part
        for key, value in settings.items()
        for part in (f"--{key}", "none" if value is None else str(value))
    ]


def accelerate_launch(
    script: str | Path, args: list[str], processes: int = 2, strategy: str = "ddp", timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run `script args` in `processes` processes with configs/accelerate/<strategy>.yaml.

    No --cpu: accelerate 1.15 runs `--cpu --num_processes 2` as ONE process unless mpirun is set up.
    Without CUDA, its multi-GPU launcher starts the processes on the CPU over gloo."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launch += [str(ROOT / f"configs/accelerate/{strategy}.yaml"), "--num_processes", str(processes)]
    launch += ["--main_process_port", str(free_port()), str(script), *args]
    # The script runs from its own directory: put the repository on the path for `tests.` imports.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.run(launch, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 (not a dict)
