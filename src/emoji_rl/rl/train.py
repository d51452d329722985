"""`emoji-rl grpo`: multi-turn GRPO of a LoRA policy on a game (docs/DESIGN.md §6): the emoji sender on
its default game, any game the registry knows with `--game NAME` (play/registry.py).

Each step plays B prompts x G rollouts to the end (every turn emoji-constrained), scores them with
the terminal reward, turns rewards into group advantages, drops groups with no spread (they carry
no signal; `dynamic_sampling` draws more prompts to refill), and takes one clipped policy-gradient
step on the LoRA adapter, with a KL to the reference (in the loss, or in the advantages as the
original had it: docs/SEED_RECIPE.md): the starting (SFT) adapter kept frozen as a second PEFT adapter,
or the base model via `disable_adapter()`, never a second copy of the weights.
Here: the loop (its settings are `rl/train_config.py`). The game comes from the registry
(`play/registry.py`), the sampler is wired in `rl/engine.py`; which adapter version plays which step is
the schedule's (`rl/rollout/schedule.py`), the update and the checkpoints the trainer's (`rl/trainer.py`),
and what a step's rollouts report is in `rl/rollout/metrics.py`.

    emoji-rl grpo --config configs/cpu/grpo.yaml
    accelerate launch --num_processes 4 -m emoji_rl.cli grpo --config configs/gpu/grpo.yaml
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from emoji_rl.config import save_config
from emoji_rl.decode.sampler import HFSampler, Sampler
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import AppendLog, drop_steps_after
from emoji_rl.io.metrics import MetricsWriter, read_metrics
from emoji_rl.io.run_lock import holds_a_run
from emoji_rl.lm import models
from emoji_rl.lm.distributed import gather
from emoji_rl.lm.processes import check_shared_dir, join_processes, peers_named
from emoji_rl.play import registry
from emoji_rl.play.spec import game_config, read_game_records
from emoji_rl.rl.batch import collate_groups
from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.engine import Engine, build_engine, wait_for_policy_server
from emoji_rl.rl.held_out import HeldOut, current_names, held_out_records
from emoji_rl.rl.policy import build_policy, checkpoint_layers
from emoji_rl.rl.rollout.collect import StepGroups, prompts_per_process
from emoji_rl.rl.rollout.metrics import (
    EPISODE_COLUMNS,
    ROLLOUTS_FILE,
    episode_table,
    log_rollouts,
    seat_metric,
    step_metrics,
)
from emoji_rl.rl.rollout.schedule import RolloutSchedule, rollout_schedule
from emoji_rl.rl.train_config import TrainConfig
from emoji_rl.rl.train_config import (
    config_for as config_for,  # the stage's Config for its game (cli.config_class)
)
from emoji_rl.rl.trainer import Trainer

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.emoji.constraint import EmojiConstraint
    from emoji_rl.play.types import GameSetup
    from emoji_rl.rl.rollout.vllm import AdapterSync

log = logging.getLogger("emoji_rl.grpo")


def train(
    cfg: TrainConfig,
    policy: PeftModel,
    tokenizer,
    setup: GameSetup,
    sampler: Sampler,
    weight_sync: AdapterSync | None = None,
) -> TrainState:
    """The GRPO loop, for any game; returns the final state. With `weight_sync` (a vLLM sampler),
    every adapter is published to the server as a version, each step's rollouts are played on a
    thread of their own by the version `cfg.max_off_policy_steps` behind (`rl/rollout/schedule.py`),
    while the trainer updates on the step before, and the update weighs each token by the truncated
    ratio of the trainer's probability to the sampler's.

    Under `accelerate launch` every process plays its share of the step's `batch_size` prompts and the
    gradients are all-reduced; the main process logs metrics and rollouts of all processes and writes the
    checkpoints and the adapter."""
    engine = Engine(sampler, weight_sync)
    trainer, state, checkpoint = Trainer.start(cfg, policy, setup.state, engine.on_server)
    schedule = rollout_schedule(cfg, trainer, setup, engine, state, checkpoint)
    held_out = _held_out(cfg, policy, tokenizer, setup, trainer.accelerator)
    grammar = _grammar(cfg, policy, tokenizer, setup)
    try:
        schedule.start()
        return _loop(cfg, trainer, setup, grammar, tokenizer, schedule, state, held_out)
    finally:
        schedule.close()


def _grammar(cfg: TrainConfig, policy: PeftModel, tokenizer, setup: GameSetup) -> EmojiConstraint | None:
    """The grammar the game's policy samples under in any of its seats (None: free text in every one),
    as wide as the policy's LM head, for the update to replay its masks."""
    if all(seat.constraint != "grammar" for seat in setup.seats):
        return None
    from emoji_rl.emoji.constraint import compile_emoji_grammar

    width = policy.get_output_embeddings().weight.shape[0]
    return compile_emoji_grammar(tokenizer, cfg.min_emoji, cfg.max_emoji, vocab_size=width)


def _loop(
    cfg: TrainConfig,
    trainer: Trainer,
    setup: GameSetup,
    grammar: EmojiConstraint | None,
    tokenizer,
    schedule: RolloutSchedule,
    state: TrainState,
    held_out: HeldOut | None,
) -> TrainState:
    is_main = trainer.accelerator.is_main_process
    run_dir = Path(cfg.output_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if is_main:
        # The steps after the checkpoint are redone: drop their lines (MetricsWriter does the same for
        # metrics.jsonl), before the log is opened.
        drop_steps_after(run_dir / ROLLOUTS_FILE, state.step)
    # Metrics (to metrics.jsonl and the trackers) and rollouts come from the main process, gathered from all.
    main_only = contextlib.nullcontext
    # A run from before the held-out names changed (#62) is resumed under the new ones.
    metrics_log = (
        MetricsWriter(run_dir, state.step, trackers=cfg, rename=current_names) if is_main else main_only()
    )
    rollouts_log = AppendLog(run_dir / ROLLOUTS_FILE) if is_main else main_only()
    with metrics_log as writer, rollouts_log as rollout_log:
        if held_out is not None and state.step == 0 and held_out.due(0) and not _logged_at_start(run_dir):
            before = held_out.run()
            if writer is not None:
                writer.write(0, before)
        steps = range(state.step, cfg.max_steps)
        bar = tqdm(steps, initial=state.step, total=cfg.max_steps, desc="grpo", disable=not is_main)
        for step in bar:
            start = time.perf_counter()
            taken, dropped = schedule.take(step)
            waited = time.perf_counter() - start
            state.epoch, state.cursor = taken.position
            state.baselines = dict(taken.baselines)
            everyone, slowest, players = _gather_rollouts(taken.groups, taken.services)
            setup.observe(everyone.played)
            metrics = step_metrics(everyone, slowest)
            metrics["async/version_lag"] = float(step - taken.version)
            metrics["async/dropped_episodes"] = float(sum(gather(dropped)))
            metrics["time/wait_rollouts_s"] = waited
            metrics.update(taken.servers)
            episodes = log_rollouts(rollout_log, step + 1, everyone.played, players) if is_main else []
            update_start = time.perf_counter()
            # This process's groups; with none kept, its played ones stand in at weight 0.
            mine = taken.groups
            groups = mine.kept or mine.played
            seats = setup.seats if setup.seated else ()
            batch = (
                collate_groups(groups, pad_id, grammar, step, len(tokenizer), seats)
                if everyone.kept
                else None
            )
            metrics.update(trainer.step(batch, bool(mine.kept), state))
            metrics["time/update_s"] = time.perf_counter() - update_start
            # Every step publishes a version, updated or not, so that version v is always step v's.
            schedule.publish(step + 1)
            metrics["optim/lr"] = trainer.scheduler.get_last_lr()[0]
            metrics["time/step_s"] = time.perf_counter() - start
            state.step = step + 1
            if held_out is not None and held_out.due(state.step):
                metrics.update(held_out.run())
            if writer is not None:
                writer.write(state.step, metrics)
                if cfg.log_completions:
                    rows = episode_table(episodes, cfg.num_completions_to_print)
                    writer.table(state.step, "episodes", EPISODE_COLUMNS, rows)
            bar.set_postfix(**_rewards(setup, metrics), **_headline(setup, metrics))
            if state.nan_streak >= cfg.nan_patience:
                raise UserError(
                    f"{state.nan_streak} steps in a row had a non-finite loss or gradient (nan_patience="
                    f"{cfg.nan_patience}); lower learning_rate or check the data. The last checkpoint in "
                    f"{run_dir / 'checkpoints'} is intact."
                )
            if state.step % cfg.save_steps == 0 or state.step == cfg.max_steps:
                trainer.save(run_dir, state, setup.state, schedule.behaviour(state.step))
    trainer.finish(run_dir)
    return state


def _held_out(
    cfg: TrainConfig, policy: PeftModel, tokenizer, setup: GameSetup, accelerator
) -> HeldOut | None:
    """The held-out evaluation `eval_steps` and `eval_before_train` ask for (None: neither): greedy,
    in process on the weights being trained, whichever engine samples the rollouts, decoded in chunks
    of the rollouts' size."""
    records = held_out_records(cfg)
    if records is None:
        return None
    decoding = cfg.decoding(
        constraint=setup.constraint, temperature=0.0, batch_size=cfg.batch_size * cfg.group_size
    )
    sampler = HFSampler(policy, tokenizer, decoding)
    rank, world = accelerator.process_index, accelerator.num_processes
    return HeldOut(records, setup, sampler, rank, world, cfg.eval_steps, cfg.eval_before_train)


def _logged_at_start(run_dir: Path) -> bool:
    """Whether an earlier attempt of this run logged its evaluation before training (kept by a resume
    that starts over at step 0)."""
    path = run_dir / "metrics.jsonl"
    return path.is_file() and any(row["step"] == 0 for row in read_metrics(run_dir))


def _gather_rollouts(
    groups: StepGroups, services: dict[str, float]
) -> tuple[StepGroups, dict[str, float], list[int]]:
    """Every process's rollouts of this step as one (a collective): groups in rank order, the
    slowest process's seconds, and the rank that played each played group."""
    parts = gather((groups, services))
    played = [group for part, _ in parts for group in part.played]
    ranks = [rank for rank, (part, _) in enumerate(parts) for _ in part.played]
    kept = [group for part, _ in parts for group in part.kept]
    seconds = max(part.seconds for part, _ in parts)
    keys = {key for _, times in parts for key in times}
    slowest = {key: max(times.get(key, 0.0) for _, times in parts) for key in sorted(keys)}
    return StepGroups(kept, played, seconds), slowest, ranks


def _rewards(setup: GameSetup, metrics: dict[str, float]) -> dict[str, str]:
    """The step's mean reward on the progress bar: each seat's, where the policy plays several."""
    if not setup.seated:
        return {"reward": f"{metrics['reward/mean']:.3f}"}
    return {seat.name: f"{metrics[seat_metric('reward/mean', seat.name)]:.3f}" for seat in setup.seats}


def _headline(setup: GameSetup, metrics: dict[str, float]) -> dict[str, str]:
    """The game's headline metric beside the reward on the progress bar (`GameSetup.headline`)."""
    if setup.headline is None or setup.headline[1] not in metrics:
        return {}
    label, key = setup.headline
    return {label: f"{metrics[key]:.3f}"}


def main(cfg: TrainConfig) -> None:
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    run_dir = Path(cfg.output_dir)
    spec = registry.load(cfg.game)
    rules = game_config(spec, cfg)
    rules.wait_for_servers(cfg.server_wait_s)
    # The process group under a launcher (one process otherwise), shared with train()'s Accelerator.
    processes = join_processes(cfg.collective_timeout_s)
    prompts_per_process(cfg.batch_size, processes.num_processes)  # before any model loads
    check_shared_dir(run_dir, processes, cfg.shared_dir_wait_s)
    if holds_a_run(run_dir) and not cfg.resume:
        raise UserError(
            f"{run_dir} already holds a run: pass --resume true to continue it, or another --output_dir"
        )
    # The inputs, checked before any model loads and before anything is written.
    records = read_game_records(rules, "train_data", cfg.train_data, cfg)
    held_out_records(cfg)
    if cfg.engine == "vllm":
        wait_for_policy_server(cfg)
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
    setup = spec.setup(rules, cfg.game_context(tokenizer, runtime, records))
    engine = build_engine(cfg, policy, tokenizer, setup.constraint)
    log.info(
        "%s; %d prompts; B=%d G=%d", setup.description, len(setup.records), cfg.batch_size, cfg.group_size
    )
    # Every process looks before the main one writes: a fresh run must not find its own config. Written
    # once the inputs are checked, so a stage that fails them leaves its directory as it found it.
    processes.wait_for_everyone()
    if processes.is_main_process:
        save_config(cfg, run_dir)
    with peers_named(run_dir, cfg.collective_timeout_s):
        state = train(cfg, policy, tokenizer, setup, engine.sampler, engine.sync)
    print(
        f"grpo: {state.step} steps; adapter in {run_dir / 'adapter'}, metrics in {run_dir / 'metrics.jsonl'}"
    )
