"""GRPO checkpoints: adapter, optimizer, scheduler, RNG states, the data cursor and the game's run
state (a curriculum), written whole or not at all, so `--resume` goes on exactly where a run
stopped. Under `accelerate launch` the main process writes it, with every process's RNG states (they
differ: each samples its own rollouts), and each process restores its own.

The optimizer's state is saved whole and keyed by parameter name (torch.distributed.checkpoint's full
state dict), gathered from every process: under FSDP each holds the moments of its shard only, so
the main process's own `optimizer.state_dict()` would be a shard, and indexed by its own parameter
order. It is restored after `accelerator.prepare`, which is where FSDP replaces the parameters the
optimizer holds by their shards: each process takes its part of the whole (`load_optimizer`)."""

from __future__ import annotations

import logging
import random
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from emoji_rl.errors import UserError
from emoji_rl.lm.adapters import ADAPTER
from emoji_rl.lm.training import follow_schedule

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.game.types import Stateful

log = logging.getLogger(__name__)


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
    game: Stateful | None = None,
    adapter_state: dict[str, torch.Tensor] | None = None,
    rng_states: list[dict[str, object]] | None = None,
    keep: int = 2,
    optimizer_state: dict[str, object] | None = None,
    behaviour: dict[int, Path] | None = None,
) -> Path:
    """Write `checkpoints/step-NNNNNN` through a temporary directory, then point `latest` at it.
    `adapter_state`: the adapter's gathered weights (`distributed.adapter_state_dict`; default: the
    policy's own, right for one process); `rng_states`: every process's `rng_state()`, in rank order
    (default: this process's); `optimizer_state`: `whole_optimizer_state(model, optimizer)`, which
    every process calls (default: this process's, right for one process); `behaviour`: the adapter
    directories, by version, that the steps after this one are sampled by (`max_off_policy_steps`),
    copied into `behaviour/step-NNNNNN`."""
    root = checkpoint_dir(run_dir)
    name = f"step-{state.step:06d}"
    tmp, final = root / f".{name}.tmp", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save_pretrained(str(tmp / "adapter"), selected_adapters=[ADAPTER], state_dict=adapter_state)
    for version, path in (behaviour or {}).items():
        shutil.copytree(path, tmp / "behaviour" / f"step-{version:06d}")
    torch.save(
        {
            "state": asdict(state),
            "optimizer": optimizer_state
            if optimizer_state is not None
            else whole_optimizer_state(policy, optimizer),
            "scheduler": scheduler.state_dict(),
            "game": game.state_dict() if game is not None else None,
            "rng": rng_states if rng_states is not None else [rng_state()],
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


def load_checkpoint(path: Path, policy: PeftModel, game: Stateful | None = None, rank: int = 0) -> TrainState:
    """Restore, before `accelerator.prepare`, what `save_checkpoint` wrote but the optimizer and its
    schedule (`load_optimizer`): the adapter, the game's state, process `rank`'s RNG states; returns
    the state to continue from."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = load_file(str(path / "adapter" / "adapter_model.safetensors"))
    set_peft_model_state_dict(policy, weights, adapter_name=ADAPTER)
    saved = _trainer_state(path)
    if game is not None:
        if saved.get("game") is None:
            # The run that wrote it had no such state (e.g. --curriculum false): say so, start it afresh.
            log.warning("%s holds no game state (curriculum): it starts from the beginning", path)
        else:
            game.load_state_dict(saved["game"])
    rngs = saved["rng"]
    if rank >= len(rngs):
        raise UserError(
            f"{path} was written by {len(rngs)} process(es) and cannot seed process {rank}: resume with "
            f"--num_processes {len(rngs)}"
        )
    set_rng_state(rngs[rank])
    return TrainState(**saved["state"])


def behaviour_adapters(path: Path) -> dict[int, Path]:
    """The adapters a checkpoint kept for the steps after it, by version (none in lockstep)."""
    return {
        int(adapter.name.removeprefix("step-")): adapter
        for adapter in sorted((path / "behaviour").glob("step-*"))
    }


def load_optimizer(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> None:
    """Restore the optimizer and its schedule from `path`, after `accelerator.prepare(model, optimizer)`:
    each process takes its shard of the saved whole state (under FSDP; all of it otherwise)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    saved = _trainer_state(path)
    optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's wrapper holds the torch one
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, saved["optimizer"], options=options)
    scheduler.load_state_dict(saved["scheduler"])
    follow_schedule(optimizer, scheduler)


def whole_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """The optimizer's state keyed by parameter name, each tensor whole, on the CPU: what a checkpoint
    stores. A collective under a process group: every process calls it, and process 0 receives it
    (the others get no tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    optimizer = getattr(optimizer, "optimizer", optimizer)
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def _trainer_state(path: Path) -> dict[str, object]:
    return torch.load(path / "trainer_state.pt", weights_only=False)


def rng_state() -> dict[str, object]:
    """This process's random generators, as a checkpoint stores them."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(rng: dict[str, object]) -> None:
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
