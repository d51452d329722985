"""Launching a stage under `accelerate launch` over 2 CPU processes (gloo), as a GPU box runs it over
N GPUs, for the slow multi-process tests, and reading what the ranks wrote."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import torch
from tests.tiny import tiny_qwen3_5

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
    script: str | Path,
    args: list[str],
    processes: int = 2,
    strategy: str = "ddp",
    timeout: float = 900,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `script args` in `processes` processes with configs/accelerate/<strategy>.yaml, `env` added
    to the environment. A launch still running after `timeout` seconds (ranks waiting on each other
    forever) is killed, all its processes, and raises `subprocess.TimeoutExpired`.

    No --cpu: accelerate 1.15 runs `--cpu --num_processes 2` as ONE process unless mpirun is set up.
    Without CUDA, its multi-GPU launcher starts the processes on the CPU over gloo."""
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file"]
    launch += [str(ROOT / f"configs/accelerate/{strategy}.yaml"), "--num_processes", str(processes)]
    launch += ["--main_process_port", str(free_port()), str(script), *args]
    # The script runs from its own directory: put the repository on the path for `tests.` imports.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # An in-process run in this test process set TORCH_NCCL_ASYNC_ERROR_HANDLING for itself
    # (lm/processes.py): the launched job gets what the launcher gives it, as from a fresh shell.
    inherited = {k: v for k, v in os.environ.items() if k != "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    env = {**inherited, "PYTHONPATH": path, **(env or {})}
    with subprocess.Popen(
        launch,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # the launcher and every rank it started
            process.communicate()
            raise
    return subprocess.CompletedProcess(launch, process.returncode, stdout, stderr)


def fsdp_on_cpu() -> None:
    """Make accelerate take its FSDP path on CPU processes over gloo, as it does on GPUs; call it first
    in a script that `accelerate launch` runs with configs/accelerate/fsdp.yaml.

    accelerate 1.15 turns `distributed_type: FSDP` into FSDP only for GPU-type states (the device
    check in `AcceleratorState.__init__`); on CPU processes it runs DDP. This makes that one decision
    as on a GPU, with the plugin accelerate built from fsdp.yaml; everything after it (the FSDP2
    prepare, the wrap policy, state dicts, gradient clipping, the Trainer's and PEFT's FSDP branches)
    is the libraries' own code, as a GPU launch runs it. torch's `fully_shard` itself runs on CPU."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def init_with_fsdp(self, *args, fsdp_plugin=None, **kwargs):
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if self.distributed_type == DistributedType.MULTI_CPU and fsdp_plugin is not None:
            # What AcceleratorState.__init__ does for MULTI_GPU when ACCELERATE_USE_FSDP is set.
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = self.distributed_type

    AcceleratorState.__init__ = init_with_fsdp


def save_tiny_qwen3_5(path: Path) -> Path:
    """`tiny_qwen3_5` with the embedded SmolLM2's tokenizer and chat template, saved to `path` as a
    model directory the stages load."""
    from emoji_rl.lm import models

    tokenizer = models.load_tokenizer(models.SMOLLM2)
    ids = ("pad_token_id", "bos_token_id", "eos_token_id")
    tiny_qwen3_5(
        vocab_size=len(tokenizer), **{name: getattr(tokenizer, name) for name in ids}
    ).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def read_weights(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    from safetensors import safe_open

    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 (not a dict)
