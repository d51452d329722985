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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from emoji_rl.errors import UserError
from emoji_rl.io.disk import disk_full_error, short_write
from emoji_rl.lm.adapters import ADAPTER
from emoji_rl.lm.distributed import adapter_state_dict, follow_schedule, gather

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.play.types import Stateful

log = logging.getLogger(__name__)


@dataclass
class TrainState:
    """Where the loop is: the next step to run and the next prompt to draw."""

    step: int = 0
    epoch: int = 0
    cursor: int = 0
    nan_streak: int = 0
    baselines: dict[str, float] = field(default_factory=dict)
    """Each seat's moving-average baseline (`baseline: ema`) after the step's rollouts; a checkpoint
    written before there were any holds none and resumes with none (the next step's mean starts it)."""


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = checkpoint_dir(run_dir) / "latest"
    if not pointer.is_file():
        return None
    path = checkpoint_dir(run_dir) / pointer.read_text().strip()
    return path if (path / "trainer_state.pt").is_file() else None


@dataclass(frozen=True)
class Snapshot:
    """What a checkpoint holds beside the loop's state, each part whole (`snapshot`)."""

    adapter: dict[str, torch.Tensor]
    """The adapter's weights (`adapter_state_dict`)."""
    optimizer: dict[str, object]
    """The optimizer's state keyed by parameter name (`whole_optimizer_state`)."""
    scheduler: dict[str, object]
    rngs: list[dict[str, object]]
    """Every process's `rng_state()`, in rank order."""
    game: dict[str, object] | None
    """The game's run state (a curriculum), or None for a game without one."""
    behaviour: dict[int, Path] = field(default_factory=dict)
    """The adapter directories, by version, that the steps after this one are sampled by
    (`max_off_policy_steps`; `rl/rollout/schedule.py`)."""


def snapshot(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    game: Stateful | None = None,
    behaviour: dict[int, Path] | None = None,
) -> Snapshot:
    """The run as a checkpoint stores it. A collective under a process group: every process gathers
    the adapter, the optimizer's state and its RNG states, which one process then writes."""
    return Snapshot(
        adapter_state_dict(model),
        whole_optimizer_state(model, optimizer),
        scheduler.state_dict(),
        gather(rng_state()),
        game.state_dict() if game is not None else None,
        behaviour or {},
    )


def save_checkpoint(
    run_dir: Path, state: TrainState, policy: PeftModel, saved: Snapshot, keep: int = 2
) -> Path:
    """Write `checkpoints/step-NNNNNN` through a temporary directory, then point `latest` at it; the
    `behaviour` adapters go to its `behaviour/step-NNNNNN`. Keeps the last `keep` checkpoints. `policy`
    writes the adapter's files (PEFT's config beside the snapshot's weights)."""
    root = checkpoint_dir(run_dir)
    name = f"step-{state.step:06d}"
    tmp, final = root / f".{name}.tmp", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _write(tmp, state, policy, saved)
    except (OSError, RuntimeError) as err:
        shutil.rmtree(tmp, ignore_errors=True)  # half a checkpoint only keeps the disk full
        if not short_write(err):
            raise
        latest = root / "latest"
        last = latest.read_text().strip() if latest.is_file() else "none yet"
        raise disk_full_error(
            f"checkpoint {name}",
            tmp,
            err,
            f"The half-written {tmp.name} is removed. The last whole checkpoint is {last}, and metrics.jsonl "
            f"holds every step up to {state.step}: free space, then rerun with --resume true.",
        ) from err
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    pointer_tmp = root / ".latest.tmp"
    pointer_tmp.write_text(name)
    pointer_tmp.rename(root / "latest")
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write(tmp: Path, state: TrainState, policy: PeftModel, saved: Snapshot) -> None:
    """A checkpoint's files into `tmp`: the adapter, the behaviour adapters, the trainer's state."""
    policy.save_pretrained(str(tmp / "adapter"), selected_adapters=[ADAPTER], state_dict=saved.adapter)
    for version, path in saved.behaviour.items():
        shutil.copytree(path, tmp / "behaviour" / f"step-{version:06d}")
    torch.save(
        {
            "state": asdict(state),
            "optimizer": saved.optimizer,
            "scheduler": saved.scheduler,
            "game": saved.game,
            "rng": saved.rngs,
        },
        tmp / "trainer_state.pt",
    )


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
