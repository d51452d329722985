"""GRPO checkpoints: adapter, optimizer, scheduler, RNG states and the data cursor, written whole or
not at all, so `--resume` goes on exactly where a run stopped."""

from __future__ import annotations

import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from peft import PeftModel

ADAPTER = "default"


@dataclass
class TrainState:
    """Where the loop is: the next step to run and the next prompt to draw."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0
    nan_streak: int = 0


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = checkpoint_dir(run_dir) / "latest"
    if not pointer.is_file():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text().strip()
    return path if (path / "trainer_state.pt").is_file() else None


def save_checkpoint(
    run_dir: Path,
    state: TrainState,
    policy: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    keep: int = 2,
) -> Path:
    """Write `checkpoints/step-NNNNNN` through a temporary directory, then point `latest` at it."""
    root = checkpoint_dir(run_dir)
    name = f"step-{state.step:06d}"
    tmp, final = root / f".{name}.tmp", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp / "adapter"), selected_adapters=[ADAPTER])
    torch.save(
        {
            "state": asdict(state),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            },
        },
        tmp / "trainer_state.pt",
    )
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer_tmp = root / ".latest.tmp"
    pointer_tmp.write_text(name)
    pointer_tmp.rename(root / "latest")
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(
    path: Path,
    policy: PeftModel,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> TrainState:
    """Restore everything `save_checkpoint` wrote; returns the state to continue from."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    set_peft_model_state_dict(policy, weights, adapter_name=ADAPTER)
    saved = torch.load(path / "trainer_state.pt", weights_only=False)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    rng = saved["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return TrainState(**saved["state"])
