"""`emoji-rl grpo`: multi-turn GRPO of a LoRA policy on a game (docs/DESIGN.md §6): the emoji sender on
its default game, any game the registry knows with `--game NAME` (game/registry.py).

Each step plays B prompts x G rollouts to the end (every turn emoji-constrained), scores them with
the terminal reward, turns rewards into group advantages, drops groups with no spread (they carry
no signal; `dynamic_sampling` draws more prompts to refill), and takes one clipped policy-gradient
step on the LoRA adapter, with a KL to the reference (in the loss, or in the advantages as the
original had it: docs/SEED_RECIPE.md): the starting (SFT) adapter kept frozen as a second PEFT adapter,
or the base model via `disable_adapter()`, never a second copy of the weights.
Here: the loop (its settings are `rl/train_config.py`, the update `rl/update.py`); the game comes from
the registry (`game/registry.py`), the sampler is wired in `rl/setup.py`, and what a step's rollouts
report is in `rl/rollout/metrics.py`.

    emoji-rl grpo --config configs/cpu/grpo.yaml
    accelerate launch --num_processes 4 -m emoji_rl.cli grpo --config configs/gpu/grpo.yaml
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from emoji_rl.config import save_config
from emoji_rl.decode.sampler import Sampler
from emoji_rl.errors import UserError
from emoji_rl.game import registry
from emoji_rl.game.registry import GameContext
from emoji_rl.io.jsonl import AppendLog, drop_steps_after
from emoji_rl.io.metrics import MetricsWriter
from emoji_rl.io.run_lock import holds_a_run
from emoji_rl.lm import models
from emoji_rl.lm.processes import check_shared_dir, join_processes, peers_named
from emoji_rl.lm.training import (
    adapter_state_dict,
    gather,
    mixed_precision,
    save_adapter,
    warn_if_fsdp_ignored,
    whole_weights,
    without_cuda,
)
from emoji_rl.rl.batch import collate_groups
from emoji_rl.rl.checkpoint import (
    TrainState,
    behaviour_adapters,
    latest_checkpoint,
    load_checkpoint,
    load_optimizer,
    rng_state,
    save_checkpoint,
    whole_optimizer_state,
)
from emoji_rl.rl.policy import build_policy, checkpoint_layers
from emoji_rl.rl.rollout.collect import Rollouts
from emoji_rl.rl.rollout.metrics import ROLLOUTS_FILE, log_rollouts, step_metrics
from emoji_rl.rl.rollout.overlap import RolloutsAhead, without_stale
from emoji_rl.rl.setup import build_sampler, rollouts_ahead
from emoji_rl.rl.train_config import TrainConfig
from emoji_rl.rl.train_config import (
    config_for as config_for,  # the stage's Config for its game (cli.config_class)
)
from emoji_rl.rl.update import update

if TYPE_CHECKING:
    from accelerate import Accelerator
    from peft import PeftModel

    from emoji_rl.game.types import GameSetup
    from emoji_rl.rl.rollout.vllm import AdapterSync

log = logging.getLogger("emoji_rl.grpo")


# --- the loop ------------------------------------------------------------------------------------------


def prompts_per_process(batch_size: int, processes: int) -> int:
    """Each process's share of a step's `batch_size` prompts. A step trains `batch_size` prompts on any
    number of processes (the seed's 32 stay 32 over 4 GPUs), so the learning rate and the KL weight tuned
    for it keep their meaning; the share must be whole."""
    if batch_size % processes:
        raise UserError(
            f"batch_size={batch_size} (prompts per step over all processes) does not divide among "
            f"{processes} processes: set batch_size to a multiple of {processes}, or launch a number of "
            "processes that divides it"
        )
    return batch_size // processes


def _publish(
    sync: AdapterSync | None, accelerator: Accelerator, version: int, save: Callable[[Path], None]
) -> str | None:
    """The main process saves version `version` with `save(directory)` and loads it on the vLLM
    server; every process returns the name it is served under (a collective, which also waits for the
    load). None without a server."""
    if sync is None:
        return None
    name = sync.publish(version, save) if accelerator.is_main_process else None
    return sync.follow(gather(name)[0])


def _publish_weights(
    sync: AdapterSync | None, accelerator: Accelerator, model: torch.nn.Module, version: int
) -> str | None:
    """Publish the adapter being trained as version `version`. Every process gathers its weights
    first: under FSDP each holds only a shard."""
    if sync is None:
        return None
    state = adapter_state_dict(model)
    return _publish(sync, accelerator, version, lambda path: save_adapter(model, path, state))


def _gather_rollouts(
    rollouts: Rollouts, services: dict[str, float]
) -> tuple[Rollouts, dict[str, float], list[int]]:
    """Every process's rollouts of this step as one (a collective): groups in rank order, the
    slowest process's seconds, and the rank that played each played group."""
    parts = gather((rollouts, services))
    played = [group for part, _ in parts for group in part.played]
    ranks = [rank for rank, (part, _) in enumerate(parts) for _ in part.played]
    kept = [group for part, _ in parts for group in part.kept]
    seconds = max(part.seconds for part, _ in parts)
    keys = {key for _, times in parts for key in times}
    slowest = {key: max(times.get(key, 0.0) for _, times in parts) for key in sorted(keys)}
    return Rollouts(kept, played, seconds), slowest, ranks


def train(
    cfg: TrainConfig,
    policy: PeftModel,
    tokenizer,
    game: GameSetup,
    sampler: Sampler,
    weight_sync: AdapterSync | None = None,
) -> TrainState:
    """The GRPO loop, for any game; returns the final state. With `weight_sync` (a vLLM sampler),
    every adapter is published to the server as a version, each step's rollouts are played on a
    thread of their own by the version `cfg.max_off_policy_steps` behind (`rl/rollout/overlap.py`),
    while the trainer updates on the step before, and the update weighs each token by the truncated
    ratio of the trainer's probability to the sampler's.

    Under `accelerate launch` every process plays its share of the step's `batch_size` prompts and the
    gradients are all-reduced; the main process logs metrics and rollouts of all processes and writes the
    checkpoints and the adapter."""
    from accelerate import Accelerator
    from transformers import get_scheduler

    accelerator = Accelerator(cpu=without_cuda(), mixed_precision=mixed_precision(policy))
    is_main, rank = accelerator.is_main_process, accelerator.process_index
    share = prompts_per_process(cfg.batch_size, accelerator.num_processes)
    log.info(
        "distributed: %s, %d process(es), %d prompts per step, %d per process",
        accelerator.distributed_type.value,
        accelerator.num_processes,
        cfg.batch_size,
        share,
    )
    warn_if_fsdp_ignored(accelerator.distributed_type.value, log)
    run_dir = Path(cfg.output_dir)
    optimizer = torch.optim.AdamW(
        [p for p in policy.parameters() if p.requires_grad],
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
        weight_decay=cfg.weight_decay,
    )
    scheduler = get_scheduler(cfg.lr_scheduler_type, optimizer, cfg.warmup_steps, cfg.max_steps)
    state = TrainState()
    checkpoint = latest_checkpoint(run_dir) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        log.warning("--resume: no checkpoint in %s, starting from step 0", run_dir)
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, policy, game.state, rank)
        log.info("resumed from %s at step %d", checkpoint, state.step)
    elif rank > 0:
        # main() seeded every process alike, so that a fresh adapter starts the same everywhere; the
        # processes' samples must not be the same draws.
        torch.manual_seed(cfg.seed + rank)
        random.seed(cfg.seed + rank)
    model, optimizer = accelerator.prepare(policy, optimizer)
    if checkpoint is not None:
        load_optimizer(checkpoint, model, optimizer, scheduler)
    rollouts = rollouts_ahead(cfg, game, sampler, weight_sync, state, rank, share, checkpoint)
    try:
        if weight_sync is not None:
            if is_main:
                weight_sync.clear_stale()
            # The versions the first steps are sampled by: those the checkpoint kept, then the weights now.
            for version, path in sorted(behaviour_adapters(checkpoint).items()) if checkpoint else []:
                copy = functools.partial(shutil.copytree, path)
                rollouts.publish(version, _publish(weight_sync, accelerator, version, copy))
            rollouts.publish(state.step, _publish_weights(weight_sync, accelerator, model, state.step))
        return _loop(
            cfg, accelerator, model, optimizer, scheduler, tokenizer, game, weight_sync, rollouts, state
        )
    finally:
        rollouts.close()


def _loop(
    cfg: TrainConfig,
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokenizer,
    game: GameSetup,
    weight_sync: AdapterSync | None,
    rollouts: RolloutsAhead,
    state: TrainState,
) -> TrainState:
    is_main = accelerator.is_main_process
    run_dir = Path(cfg.output_dir)
    # The hf sampler decodes with the model being trained: under FSDP, on its whole weights.
    rollout_weights = (lambda: whole_weights(model)) if cfg.engine == "hf" else contextlib.nullcontext
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    # A vLLM sampler is not the trainer: its tokens are weighed by the truncated ratio.
    settings = cfg.update_settings(importance_weights=weight_sync is not None)
    if is_main:
        # The steps after the checkpoint are redone: drop their lines (MetricsWriter does the same for
        # metrics.jsonl), before the log is opened.
        drop_steps_after(run_dir / ROLLOUTS_FILE, state.step)
    # Metrics (to metrics.jsonl and the trackers) and rollouts come from the main process, gathered from all.
    main_only = contextlib.nullcontext
    metrics_log = MetricsWriter(run_dir, state.step, trackers=cfg) if is_main else main_only()
    rollouts_log = AppendLog(run_dir / ROLLOUTS_FILE) if is_main else main_only()
    with metrics_log as writer, rollouts_log as rollout_log:
        steps = range(state.step, cfg.max_steps)
        bar = tqdm(steps, initial=state.step, total=cfg.max_steps, desc="grpo", disable=not is_main)
        for step in bar:
            start = time.perf_counter()
            with rollout_weights():
                played = rollouts.take(step)
            waited = time.perf_counter() - start
            played, dropped = without_stale(played, cfg.max_off_policy_steps)
            state.epoch, state.cursor = played.position
            everyone, slowest, players = _gather_rollouts(played.rollouts, played.services)
            game.observe(everyone.played)
            metrics = step_metrics(everyone, slowest)
            metrics["async/version_lag"] = float(step - played.version)
            metrics["async/dropped_episodes"] = float(sum(gather(dropped)))
            metrics["time/wait_rollouts_s"] = waited
            if rollout_log is not None:
                log_rollouts(rollout_log, step + 1, everyone.played, players)
            update_start = time.perf_counter()
            mine = played.rollouts
            if everyone.kept:
                # This process's groups; with none kept, its played ones stand in at weight 0.
                batch = collate_groups(
                    mine.kept or mine.played, pad_id, game.constraint, step, len(tokenizer)
                )
                metrics.update(
                    update(settings, accelerator, model, optimizer, batch, contributes=bool(mine.kept))
                )
                finite = math.isfinite(metrics["optim/loss"]) and math.isfinite(metrics["optim/grad_norm"])
            else:
                # Never a silent no-op: say so, and count it.
                log.warning("step %d: every group had zero reward spread; no update", step + 1)
                finite = True
            updated = bool(everyone.kept) and finite
            metrics["optim/skipped"] = float(not updated)
            if updated:
                optimizer.step()
                scheduler.step()  # the schedule counts updates, so skipped steps do not shorten it
                state.nan_streak = 0
            elif not finite:
                optimizer.zero_grad(set_to_none=True)
                state.nan_streak += 1
                log.warning(
                    "step %d: non-finite loss or gradient, step skipped (%d in a row)",
                    step + 1,
                    state.nan_streak,
                )
            metrics["time/update_s"] = time.perf_counter() - update_start
            # Every step publishes a version, updated or not, so that version v is always step v's.
            name = _publish_weights(weight_sync, accelerator, model, step + 1)
            if name is not None:
                rollouts.publish(step + 1, name)
            metrics["optim/lr"] = scheduler.get_last_lr()[0]
            metrics["time/step_s"] = time.perf_counter() - start
            state.step = step + 1
            if writer is not None:
                writer.write(state.step, metrics)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", **_headline(game, metrics))
            if state.nan_streak >= cfg.nan_patience:
                raise UserError(
                    f"{state.nan_streak} steps in a row had a non-finite loss or gradient (nan_patience="
                    f"{cfg.nan_patience}); lower learning_rate or check the data. The last checkpoint in "
                    f"{run_dir / 'checkpoints'} is intact."
                )
            if state.step % cfg.save_steps == 0 or state.step == cfg.max_steps:
                # The adapters the steps after this one are sampled by, for a resume to sample them alike.
                behaviour = (
                    {
                        v: weight_sync.adapter_path(v)
                        for v in range(rollouts.version_for(state.step), state.step)
                    }
                    if weight_sync is not None and is_main
                    else {}
                )
                _save(accelerator, run_dir, state, model, optimizer, scheduler, game, behaviour)
    adapter = adapter_state_dict(model)
    if is_main:
        save_adapter(model, run_dir / "adapter", adapter)
    accelerator.wait_for_everyone()
    return state


def _headline(game: GameSetup, metrics: dict[str, float]) -> dict[str, str]:
    """The game's headline metric beside the reward on the progress bar (`GameSetup.headline`)."""
    if game.headline is None or game.headline[1] not in metrics:
        return {}
    label, key = game.headline
    return {label: f"{metrics[key]:.3f}"}


def _save(
    accelerator: Accelerator,
    run_dir: Path,
    state: TrainState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    game: GameSetup,
    behaviour: dict[int, Path],
) -> None:
    """A checkpoint: every process gathers the adapter, the optimizer's state and its RNG states, the
    main process writes, with the `behaviour` adapters (version: directory)."""
    adapter = adapter_state_dict(model)
    moments = whole_optimizer_state(model, optimizer)
    rngs = gather(rng_state())
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        save_checkpoint(
            run_dir,
            state,
            unwrapped,
            optimizer,
            scheduler,
            game.state,
            adapter,
            rngs,
            optimizer_state=moments,
            behaviour=behaviour,
        )
    accelerator.wait_for_everyone()


def main(cfg: TrainConfig) -> None:
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    run_dir = Path(cfg.output_dir)
    # The process group under a launcher (one process otherwise), shared with train()'s Accelerator.
    processes = join_processes(cfg.collective_timeout_s)
    prompts_per_process(cfg.batch_size, processes.num_processes)  # before any model loads
    check_shared_dir(run_dir, processes, cfg.shared_dir_wait_s)
    if holds_a_run(run_dir) and not cfg.resume:
        raise UserError(
            f"{run_dir} already holds a run: pass --resume true to continue it, or another --output_dir"
        )
    # Every process looks before the main one writes: a fresh run must not find its own config.
    processes.wait_for_everyone()
    if processes.is_main_process:
        save_config(cfg, run_dir)
    runtime = models.pick_runtime()
    log.info("runtime: %s", runtime.describe())
    tokenizer = models.load_tokenizer(cfg.model)
    policy = build_policy(
        cfg.model,
        runtime,
        cfg.init_adapter,
        cfg.reference if cfg.beta > 0 else None,
        cfg.lora_r,
        cfg.lora_alpha,
        cfg.lora_target_modules,
    )
    if cfg.gradient_checkpointing:
        checkpoint_layers(policy)
    width = policy.get_output_embeddings().weight.shape[0]
    game = registry.load(cfg.game).setup(cfg, GameContext(tokenizer, runtime, width))
    sampler, weight_sync = build_sampler(cfg, policy, tokenizer, "grammar" if game.constraint else "none")
    log.info("%s; %d prompts; B=%d G=%d", game.description, len(game.records), cfg.batch_size, cfg.group_size)
    with peers_named(run_dir, cfg.collective_timeout_s):
        state = train(cfg, policy, tokenizer, game, sampler, weight_sync)
    print(
        f"grpo: {state.step} steps; adapter in {run_dir / 'adapter'}, metrics in {run_dir / 'metrics.jsonl'}"
    )
