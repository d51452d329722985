"""What a trainer's processes share under `accelerate launch`: values gathered from every rank, the
adapter's full weights, gathered before the main process saves them, under FSDP the whole weights
for the length of an in-process rollout (`whole_weights`); and a restored run's learning rate
(`follow_schedule`, both trainers').

Under FSDP a rank holds only its shard of each parameter (a DTensor): `save_pretrained` on the main
process alone would write that shard. The adapter's parameters are gathered on every rank first (a
collective: every rank must call it, in the same order), then written by the main process.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from emoji_rl.lm.adapters import ADAPTER

if TYPE_CHECKING:
    from peft import PeftModel


def without_cuda() -> bool:
    """Pass as `cpu=` to accelerate's `PartialState`/`Accelerator`. Without it, under `accelerate
    launch` on a machine without CUDA, accelerate 1.15 joins the gloo process group yet reports one
    process (DistributedType.NO): every rank would be the main one, play the same prompts and write
    the same files. With it, the ranks are MULTI_CPU."""
    return not torch.cuda.is_available()


def mixed_precision(model: torch.nn.Module) -> str:
    """The `mixed_precision` to build an Accelerator with for `model`: bf16 autocast for bf16 weights,
    none otherwise. Left unset, accelerate takes ACCELERATE_MIXED_PRECISION, which
    configs/accelerate/*.yaml export as bf16 to every process: an fp32 run (the CPU) would train
    under bf16 autocast under `accelerate launch` and in fp32 under `torchrun`."""
    base = getattr(model, "get_base_model", lambda: model)()
    return "bf16" if next(base.parameters()).dtype == torch.bfloat16 else "no"


def warn_if_fsdp_ignored(distributed_type: str, logger: logging.Logger) -> None:
    """Warn on `logger` (the stage's) when FSDP was asked for (fsdp.yaml) but accelerate runs
    `distributed_type` instead: accelerate turns FSDP on only over accelerators (GPUs); on CPUs it
    runs DDP, silently."""
    if os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true" and distributed_type != "FSDP":
        logger.warning("FSDP was asked for, but accelerate runs %s here: no sharding", distributed_type)


def gather(value: Any, group: Any = None) -> list[Any]:
    """Every rank's `value`, in rank order (a collective over `group`, by default every process);
    `[value]` without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value, group=group)
    return out


def unwrap(model: torch.nn.Module) -> PeftModel:
    """The PEFT model inside a DDP wrapper (FSDP2 shards in place and wraps nothing)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable adapter's entries of the model's state dict, each a whole tensor on every rank.

    A collective under FSDP (each sharded entry is all-gathered): call it on every rank. Only the
    trainable parameters are gathered, never the frozen base, so publishing stays as cheap as the
    adapter is small. The keys are the model's own (`...lora_A.default.weight`), as PEFT's
    `save_pretrained(state_dict=...)` expects them."""
    from torch.distributed.tensor import DTensor

    peft_model = unwrap(model)
    trainable = {name for name, p in peft_model.named_parameters() if p.requires_grad}
    if not trainable:
        raise ValueError(f"the model has no trainable parameters: no adapter {ADAPTER!r} to save")
    state = peft_model.state_dict()
    return {
        name: (value.full_tensor() if isinstance(value, DTensor) else value).detach().cpu()
        for name, value in state.items()
        if name in trainable
    }


def save_adapter(model: torch.nn.Module, path: Path, state: dict[str, torch.Tensor]) -> None:
    """Write the adapter from its gathered `state` (`adapter_state_dict`) as an ordinary PEFT directory."""
    unwrap(model).save_pretrained(str(path), selected_adapters=[ADAPTER], state_dict=state)


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """Under FSDP2, every rank holds the whole parameters from entry to exit (one all-gather per shard
    unit, a collective: every rank enters, in the same order); without FSDP, nothing happens.

    For in-process rollouts: a sharded forward all-gathers each unit's parameters, a collective, so
    ranks whose rows stop at different steps (or that prefill a different number of times) would
    wait on each other forever. With the parameters whole and kept whole, a forward is local. Each
    unit's reshard-after-forward setting is restored on exit, as accelerate set it."""
    from torch.distributed.fsdp import FSDPModule

    units = [module for module in model.modules() if isinstance(module, FSDPModule)]
    if not units:
        yield
        return
    # torch 2.13's FSDP2 has no public getter for the setting, hence its internals here (the FSDP
    # launch tests run through them). The root decides at its first forward whether it reshards after
    # forward: decide it now, so that the settings saved below are the ones training runs with.
    units[0]._get_fsdp_state()._lazy_init()
    states = [unit._get_fsdp_state() for unit in units]
    saved = [[group.post_forward_mesh_info for group in state._fsdp_param_groups] for state in states]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit, state, infos in zip(units, states, saved, strict=True):
            unit.reshard()
            for group, info in zip(state._fsdp_param_groups, infos, strict=True):
                group.post_forward_mesh_info = info


def follow_schedule(
    optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
) -> None:
    """Set the optimizer's learning rate from `scheduler` at the step it was restored to.

    A restored optimizer holds the rate the saved run's schedule had reached, while the restored
    scheduler goes on with this run's (LambdaLR saves no functions), so a run resumed with a larger
    max_steps took its first step at the old schedule's end: 0 after a linear decay. With the same
    schedule this sets the rate the optimizer already holds."""
    lambdas = getattr(scheduler, "lr_lambdas", None)  # every schedule the configs offer is a LambdaLR
    if lambdas is None:
        return
    for group, base_lr, factor in zip(optimizer.param_groups, scheduler.base_lrs, lambdas, strict=True):
        group["lr"] = base_lr * factor(scheduler.last_epoch)
    # What get_last_lr reports, and the Trainer logs; LRScheduler.step sets it the same way.
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
