"""The trainer's side of a GRPO step (docs/DESIGN.md §6): the accelerator, the model being trained, its
optimizer and learning-rate schedule, and what a step does with them: one update from the step's
batch and the optimizer's step (or a skipped step, counted), a checkpoint, the final adapter. The loop
that feeds it is `rl/train.py`; the update itself is `rl/update.py`.

Under `accelerate launch` every process holds a Trainer: the gradients are all-reduced in the update,
the checkpoint and the adapter are gathered from every process and written by the main one."""

from __future__ import annotations

import logging
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from emoji_rl.lm.distributed import (
    adapter_state_dict,
    mixed_precision,
    save_adapter,
    warn_if_fsdp_ignored,
    without_cuda,
)
from emoji_rl.rl.checkpoint import (
    TrainState,
    latest_checkpoint,
    load_checkpoint,
    load_optimizer,
    save_checkpoint,
    snapshot,
)
from emoji_rl.rl.rollout.collect import prompts_per_process
from emoji_rl.rl.update import UpdateSettings, update

if TYPE_CHECKING:
    from accelerate import Accelerator
    from peft import PeftModel

    from emoji_rl.play.types import Stateful
    from emoji_rl.rl.batch import Batch
    from emoji_rl.rl.train_config import TrainConfig

log = logging.getLogger("emoji_rl.grpo")


@dataclass
class Trainer:
    """The policy as it trains: `model` and `optimizer` as the accelerator prepared them."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    settings: UpdateSettings

    @classmethod
    def start(
        cls, cfg: TrainConfig, policy: PeftModel, game: Stateful | None, importance_weights: bool
    ) -> tuple[Trainer, TrainState, Path | None]:
        """A trainer for `policy`, and the state it starts from: a fresh run's, or with `cfg.resume` the
        last checkpoint's (the checkpoint is returned too), the game's run state restored into `game`.
        `importance_weights`: the sampler is not the trainer (a vLLM server), so the update weighs
        each token by the truncated probability ratio."""
        from accelerate import Accelerator
        from transformers import get_scheduler

        accelerator = Accelerator(cpu=without_cuda(), mixed_precision=mixed_precision(policy))
        rank = accelerator.process_index
        log.info(
            "distributed: %s, %d process(es), %d prompts per step, %d per process",
            accelerator.distributed_type.value,
            accelerator.num_processes,
            cfg.batch_size,
            prompts_per_process(cfg.batch_size, accelerator.num_processes),
        )
        warn_if_fsdp_ignored(accelerator.distributed_type.value, log)
        optimizer = torch.optim.AdamW(
            [p for p in policy.parameters() if p.requires_grad],
            lr=cfg.learning_rate,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_epsilon,
            weight_decay=cfg.weight_decay,
        )
        scheduler = get_scheduler(cfg.lr_scheduler_type, optimizer, cfg.warmup_steps, cfg.max_steps)
        state = TrainState()
        run_dir = Path(cfg.output_dir)
        checkpoint = latest_checkpoint(run_dir) if cfg.resume else None
        if cfg.resume and checkpoint is None:
            log.warning("--resume: no checkpoint in %s, starting from step 0", run_dir)
        if checkpoint is not None:
            state = load_checkpoint(checkpoint, policy, game, rank)
            log.info("resumed from %s at step %d", checkpoint, state.step)
        elif rank > 0:
            # main() seeded every process alike, so that a fresh adapter starts the same everywhere; the
            # processes' samples must not be the same draws.
            torch.manual_seed(cfg.seed + rank)
            random.seed(cfg.seed + rank)
        model, optimizer = accelerator.prepare(policy, optimizer)
        if checkpoint is not None:
            load_optimizer(checkpoint, model, optimizer, scheduler)
        settings = cfg.update_settings(importance_weights)
        return cls(accelerator, model, optimizer, scheduler, settings), state, checkpoint

    def step(self, batch: Batch | None, contributes: bool, state: TrainState) -> dict[str, float]:
        """Step `state.step`'s update from `batch` (None: no process kept a group, so no update;
        `contributes` false: this process kept none, its batch stands in at weight 0) and the
        optimizer's step. A non-finite loss or gradient skips the step and counts it in
        `state.nan_streak`. Returns the update's metrics."""
        if batch is None:
            # Never a silent no-op: say so, and count it.
            log.warning("step %d: every group had zero reward spread; no update", state.step + 1)
            metrics: dict[str, float] = {}
            finite = True
        else:
            metrics = update(
                self.settings, self.accelerator, self.model, self.optimizer, batch, contributes=contributes
            )
            finite = math.isfinite(metrics["optim/loss"]) and math.isfinite(metrics["optim/grad_norm"])
        updated = batch is not None and finite
        metrics["optim/skipped"] = float(not updated)
        if updated:
            self.optimizer.step()
            self.scheduler.step()  # the schedule counts updates, so skipped steps do not shorten it
            state.nan_streak = 0
        elif not finite:
            self.optimizer.zero_grad(set_to_none=True)
            state.nan_streak += 1
            log.warning(
                "step %d: non-finite loss or gradient, step skipped (%d in a row)",
                state.step + 1,
                state.nan_streak,
            )
        return metrics

    def save(
        self, run_dir: Path, state: TrainState, game: Stateful | None, behaviour: dict[int, Path]
    ) -> None:
        """A checkpoint of the run at `state`, with the game's run state and the `behaviour` adapters
        (version: directory); every process gathers its part, the main process writes."""
        saved = snapshot(self.model, self.optimizer, self.scheduler, game, behaviour)
        if self.accelerator.is_main_process:
            save_checkpoint(run_dir, state, self.accelerator.unwrap_model(self.model), saved)
        self.accelerator.wait_for_everyone()

    def finish(self, run_dir: Path) -> None:
        """The trained adapter, gathered from every process, in `run_dir/adapter`."""
        adapter = adapter_state_dict(self.model)
        if self.accelerator.is_main_process:
            save_adapter(self.model, run_dir / "adapter", adapter)
        self.accelerator.wait_for_everyone()
