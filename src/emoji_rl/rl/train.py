"""`emoji-rl grpo`: multi-turn GRPO of the emoji sender on the retrieval game (DESIGN §5).

Each step plays B prompts x G rollouts to the end (every turn emoji-constrained), scores them with
the terminal reward, turns rewards into group advantages, drops groups with no spread (they carry
no signal; `dynamic_sampling` draws more prompts to refill), and takes one clipped policy-gradient
step on the LoRA adapter, with a k3 KL to the reference: the starting (SFT) adapter kept frozen as a
second PEFT adapter, or the base model via `disable_adapter()`, never a second copy of the weights.

    emoji-rl grpo --config configs/cpu/grpo.yaml
    accelerate launch --num_processes 4 -m emoji_rl.cli grpo --config configs/gpu/grpo.yaml
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from tqdm.auto import tqdm

from emoji_rl import models
from emoji_rl.config import save_config
from emoji_rl.data.jsonl import AppendLog, read_jsonl
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI
from emoji_rl.errors import UserError
from emoji_rl.generate import MAX_NEW_TOKENS, Constraint
from emoji_rl.metrics import MetricsWriter
from emoji_rl.rl import grpo
from emoji_rl.rl.batch import Batch, collate, token_logprobs
from emoji_rl.rl.checkpoint import ADAPTER, TrainState, latest_checkpoint, load_checkpoint, save_checkpoint
from emoji_rl.rl.judge import JudgeKind
from emoji_rl.rl.policy import build_policy, reference_mode
from emoji_rl.rl.rollout.collect import PromptStream, collect
from emoji_rl.rl.rollout.play import Sampler
from emoji_rl.rl.types import Episode, EpisodeGroup, Game

if TYPE_CHECKING:
    from accelerate import Accelerator
    from peft import PeftModel

    from emoji_rl.emoji.constraint import EmojiConstraint
    from emoji_rl.rl.rollout.vllm import AdapterSync

log = logging.getLogger("emoji_rl.grpo")


@dataclass
class Config:
    """Multi-turn GRPO of the emoji sender on the retrieval game."""

    # --- core ---
    model: str = field(default=models.SMOLLM2, metadata={"help": "base model spec of the sender"})
    init_adapter: str | None = field(
        default=None, metadata={"help": "LoRA adapter to start from (the SFT output); none = a fresh adapter"}
    )
    reference: Literal["init", "base"] = field(
        default="init",
        metadata={"help": "KL reference: `init` = the starting adapter, frozen; `base` = the base model"},
    )
    train_data: str = field(
        default="data/rl_train.jsonl", metadata={"help": "RL prompts, JSONL with `target`"}
    )
    output_dir: str = field(
        default="runs/grpo", metadata={"help": "run directory: config, metrics, checkpoints"}
    )
    max_steps: int = field(default=20, metadata={"help": "optimizer steps to run"})
    batch_size: int = field(default=4, metadata={"help": "prompts per step per process (B); gpu: 32"})
    group_size: int = field(
        default=4, metadata={"help": "rollouts per prompt (G >= 2); seed 003: G=2 wastes 75% of steps"}
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW step size; gpu: 5e-6 (seed 001)"})
    beta: float = field(
        default=0.01, metadata={"help": "KL coefficient (k3 estimator); 0 skips the reference"}
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank of a fresh adapter; gpu: 32"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha of a fresh adapter"})
    lora_target_modules: str = field(
        default="all-linear", metadata={"help": "PEFT target_modules of a fresh adapter"}
    )
    # --- game ---
    game: Literal["retrieval", "wordle"] = field(
        default="retrieval", metadata={"help": "retrieval (train_data holds `target`) or wordle (`answer`)"}
    )
    curriculum: bool = field(
        default=True,
        metadata={"help": "wordle: lower format and raise strategy weights once format is learned"},
    )
    curriculum_threshold: float = field(
        default=0.9,
        metadata={"help": "wordle: strict-format rate that starts the strategy phase (seed 003 §14)"},
    )
    curriculum_window: int = field(
        default=64, metadata={"help": "wordle: episodes the format rate is taken over"}
    )
    max_turns: int = field(default=5, metadata={"help": "sender turns before the game ends"})
    tau: float = field(default=0.85, metadata={"help": "similarity that ends the game as a success"})
    min_emoji: int = field(default=MIN_EMOJI, metadata={"help": "fewest emoji in a valid turn"})
    max_emoji: int = field(default=MAX_EMOJI, metadata={"help": "most emoji in a valid turn"})
    success_bonus: float = field(default=0.5, metadata={"help": "reward added when similarity >= tau"})
    turn_cost: float = field(default=0.1, metadata={"help": "reward subtracted per turn used"})
    format_penalty: float = field(default=0.5, metadata={"help": "reward subtracted for an invalid turn"})
    repetition_penalty: float = field(default=0.3, metadata={"help": "times (1 - unique/total emoji)"})
    judge: JudgeKind = field(
        default="hf",
        metadata={"help": "judge kind: lexicon (emoji names), hf (in-process), openai (a vLLM server)"},
    )
    judge_view: Literal["raw", "gloss"] = field(
        default="gloss",
        metadata={"help": "what an LLM judge sees: raw emoji, or emoji with names (small judges)"},
    )
    judge_model: str = field(default=models.SMOLLM2, metadata={"help": "model spec of an LLM judge"})
    judge_url: str = field(
        default="http://127.0.0.1:8001",
        metadata={"help": "base URL of an openai judge (launch/serve_judge.sh)"},
    )
    judge_api_key_env: str | None = field(
        default="JUDGE_API_KEY", metadata={"help": "env var holding the judge server's key; unset sends none"}
    )
    similarity_model: str = field(
        default=models.MINILM, metadata={"help": "sentence embedder for the reward"}
    )
    # --- sampling ---
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature of the sender"})
    max_new_tokens: int = field(default=MAX_NEW_TOKENS, metadata={"help": "token budget of one sender turn"})
    engine: Literal["hf", "vllm"] = field(
        default="hf",
        metadata={
            "help": "rollouts: hf = in-process generate; vllm = a vLLM server (launch/serve_policy.sh) "
            "that hot-loads each new adapter"
        },
    )
    vllm_url: str = field(
        default="http://127.0.0.1:8002",
        metadata={"help": "base URL of the policy server (POLICY_HOST/POLICY_PORT)"},
    )
    vllm_served_name: str = field(
        default="policy",
        metadata={"help": "its --served-model-name (POLICY_NAME); adapters load as NAME-v<step>"},
    )
    vllm_api_key_env: str | None = field(
        default="POLICY_API_KEY",
        metadata={"help": "env var holding the policy server's key; unset sends none"},
    )
    vllm_adapter_keep: int = field(
        default=2, metadata={"help": "adapter versions kept loaded and on disk (>= 1, <= --max-cpu-loras)"}
    )
    vllm_timeout_s: float = field(default=300.0, metadata={"help": "seconds per request before a retry"})
    vllm_wait_s: float = field(
        default=900.0,
        metadata={"help": "seconds to wait at start for the server (it refuses connections while loading)"},
    )
    # --- advanced ---
    std_scaling: Literal["group", "batch", "none"] = field(
        default="group", metadata={"help": "advantage scaling: group std (GRPO), batch std, none (Dr. GRPO)"}
    )
    aggregation: Literal["token_mean", "seq_mean", "constant"] = field(
        default="token_mean",
        metadata={"help": "loss reduction: token_mean (DAPO), seq_mean (GRPO), constant (Dr. GRPO)"},
    )
    eps_low: float = field(default=0.2, metadata={"help": "PPO clip below 1"})
    eps_high: float = field(default=0.2, metadata={"help": "PPO clip above 1 (DAPO clip-higher: 0.28)"})
    dynamic_sampling: bool = field(
        default=False, metadata={"help": "draw more prompts to replace groups with zero reward spread (DAPO)"}
    )
    max_resample_rounds: int = field(
        default=2, metadata={"help": "extra draws per step with dynamic_sampling"}
    )
    per_device_train_batch_size: int = field(
        default=8,
        metadata={"help": "episodes per forward/backward pass (gradient accumulation inside a step)"},
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm"})
    nan_patience: int = field(default=3, metadata={"help": "stop after this many non-finite steps in a row"})
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = field(
        default="constant", metadata={"help": "learning-rate schedule over max_steps"}
    )
    warmup_steps: int = field(default=0, metadata={"help": "linear warm-up steps"})
    save_steps: int = field(default=10, metadata={"help": "checkpoint every N steps (and at the end)"})
    seed: int = field(default=0, metadata={"help": "random seed (prompt order, sampling, judge)"})
    resume: bool = field(default=False, metadata={"help": "continue from the last checkpoint in output_dir"})

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(
                f"group_size={self.group_size} must be >= 2: the advantage is reward minus the group mean"
            )
        if self.aggregation == "constant" and self.max_new_tokens <= 0:
            raise ValueError(
                "aggregation=constant normalizes by max_new_tokens * max_turns: set max_new_tokens > 0"
            )
        if self.game == "wordle" and self.engine == "vllm":
            raise ValueError(
                "game=wordle with engine=vllm is not supported yet: the vllm sampler always sends the emoji "
                "grammar; use engine=hf"
            )
        if self.vllm_adapter_keep < 1:
            raise ValueError(
                f"vllm_adapter_keep={self.vllm_adapter_keep} must be >= 1: the sampler needs one adapter"
            )
        if self.reference == "init" and self.init_adapter is None and self.beta > 0:
            self.reference = "base"  # a fresh adapter starts equal to the base model


# --- update ------------------------------------------------------------------------------------------


def _shares(batch: Batch, cfg: Config) -> Iterator[tuple[Batch, float]]:
    """Micro-batches and the weight of each in the full batch's aggregate, so that accumulating
    micro-batch losses gives exactly the loss of the whole batch."""
    total_tokens = batch.mask_D_T.sum().item()
    for start in range(0, batch.size, cfg.per_device_train_batch_size):
        micro = batch.rows(start, start + cfg.per_device_train_batch_size)
        if cfg.aggregation == "token_mean":
            yield micro, micro.mask_D_T.sum().item() / total_tokens
        else:
            yield micro, micro.size / batch.size


def update(
    cfg: Config,
    accelerator: Accelerator,
    policy: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: Batch,
    use_importance_weights: bool,
) -> dict[str, float]:
    """One clipped policy-gradient step over the batch; returns the optimizer metrics."""
    unwrapped = accelerator.unwrap_model(policy)
    sums = {"loss": 0.0, "kl": 0.0, "clip_frac": 0.0, "sampler_kl": 0.0}
    max_tokens = cfg.max_new_tokens * cfg.max_turns
    optimizer.zero_grad(set_to_none=True)
    for micro, weight in _shares(batch, cfg):
        micro = micro.to(accelerator.device)
        logp = token_logprobs(policy, micro, cfg.temperature)
        # One update per batch: the policy that sampled is the policy being updated, so the old
        # log-probs are the current ones, detached (ratio 1, gradient of the ratio intact).
        old = logp.detach()
        pg_loss, clipped = grpo.ppo_clip_loss(logp, old, micro.advantages_D, cfg.eps_low, cfg.eps_high)
        if use_importance_weights:
            pg_loss = pg_loss * grpo.truncated_importance_weights(old, micro.sampler_logp_D_T)
        per_token = pg_loss
        if cfg.beta > 0:
            with torch.no_grad(), reference_mode(unwrapped, cfg.reference):
                ref = token_logprobs(policy, micro, cfg.temperature)
            kl = grpo.k3_kl(logp, ref)
            per_token = per_token + cfg.beta * kl
            sums["kl"] += weight * grpo.masked_mean(kl.detach(), micro.mask_D_T).item()
        loss = grpo.aggregate(per_token, micro.mask_D_T, cfg.aggregation, max_tokens) * weight
        accelerator.backward(loss)
        sums["loss"] += loss.item()
        sums["clip_frac"] += weight * grpo.masked_mean(clipped, micro.mask_D_T).item()
        sums["sampler_kl"] += weight * grpo.masked_mean(micro.sampler_logp_D_T - old, micro.mask_D_T).item()
    params = [p for p in policy.parameters() if p.requires_grad]
    grad_norm = float(accelerator.clip_grad_norm_(params, cfg.max_grad_norm))
    return {
        **{f"optim/{k}": v for k, v in sums.items() if k != "sampler_kl"},
        "sampler/kl_vs_trainer": sums["sampler_kl"],
        "optim/grad_norm": grad_norm,
    }


# --- metrics and logs ----------------------------------------------------------------------------------


def rollout_metrics(played: Sequence[EpisodeGroup], kept: int) -> dict[str, float]:
    episodes = [e for g in played for e in g.episodes]
    rewards = torch.tensor([e.reward for e in episodes], dtype=torch.float)
    final = [e.turns[-1].result.metrics for e in episodes]
    keys = sorted({k for m in final for k in m})
    metrics = {
        "reward/mean": rewards.mean().item(),
        "reward/std": rewards.std().item() if len(rewards) > 1 else 0.0,
        "group/frac_zero_std": 1.0 - kept / len(played),
        "group/played": float(len(played)),
        "group/kept": float(kept),
        "tokens/sampled": float(sum(len(t.action_ids) for e in episodes for t in e.turns)),
    }
    for key in keys:
        values = [m[key] for m in final if key in m]
        name = f"{key}/mean" if key.startswith("reward/") else f"game/{key}"
        metrics[name] = sum(values) / len(values)
    return metrics


def log_rollouts(log_file: AppendLog, step: int, groups: Sequence[EpisodeGroup], cfg: Config) -> None:
    for group in groups:
        rewards = torch.tensor([group.rewards], dtype=torch.float)
        advantages = grpo.group_advantages(rewards, cfg.std_scaling)[0].tolist()
        for g, (episode, advantage) in enumerate(zip(group.episodes, advantages, strict=True)):
            log_file.append(
                {
                    "step": step,
                    "prompt_id": group.prompt_id,
                    "rollout": g,
                    "reward": episode.reward,
                    "advantage": advantage,
                    "turns": [{**turn.result.log, **turn.result.metrics} for turn in episode.turns],
                }
            )


# --- the loop ------------------------------------------------------------------------------------------


def _sync_weights(
    sync: AdapterSync | None, accelerator: Accelerator, model: torch.nn.Module, step: int
) -> None:
    """Save the adapter and load it on the vLLM server (main process); the others follow its name."""
    if sync is None:
        return
    if accelerator.is_main_process:
        policy = accelerator.unwrap_model(model)
        sync.publish(step, lambda path: policy.save_pretrained(str(path), selected_adapters=[ADAPTER]))
    accelerator.wait_for_everyone()
    if not accelerator.is_main_process:
        sync.follow(step)


def train(
    cfg: Config,
    policy: PeftModel,
    tokenizer,
    constraint: EmojiConstraint | None,
    sampler: Sampler,
    make_game: Callable[[dict[str, str]], Game],
    records: Sequence[dict[str, str]],
    extra_seconds: Callable[[], dict[str, float]] = dict,
    weight_sync: AdapterSync | None = None,
) -> TrainState:
    """The GRPO loop, for any game; returns the final state. `extra_seconds` reports time spent in
    services (judge, similarity) since the start, for the time/ metrics. With `weight_sync` (a vLLM
    sampler), every new adapter is published to the server before the next rollout, and the update
    uses truncated importance weights for the sampler/trainer mismatch."""
    from accelerate import Accelerator
    from transformers import get_scheduler

    accelerator = Accelerator()
    run_dir = Path(cfg.output_dir)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=cfg.learning_rate)
    scheduler = get_scheduler(cfg.lr_scheduler_type, optimizer, cfg.warmup_steps, cfg.max_steps)
    state = TrainState()
    checkpoint = latest_checkpoint(run_dir) if cfg.resume else None
    if cfg.resume and checkpoint is None:
        log.warning("--resume: no checkpoint in %s, starting from step 0", run_dir)
    if checkpoint is not None:
        state = load_checkpoint(checkpoint, policy, optimizer, scheduler)
        log.info("resumed from %s at step %d", checkpoint, state.step)
    model, optimizer = accelerator.prepare(policy, optimizer)
    if weight_sync is not None and accelerator.is_main_process:
        weight_sync.clear_stale()
    _sync_weights(weight_sync, accelerator, model, state.step)
    stream = PromptStream(records, cfg.seed + accelerator.process_index, state)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with (
        MetricsWriter(run_dir, resume_from_step=state.step) as writer,
        AppendLog(run_dir / "rollouts.jsonl") as rollout_log,
    ):
        bar = tqdm(range(state.step, cfg.max_steps), initial=state.step, total=cfg.max_steps, desc="grpo")
        for step in bar:
            services_before = extra_seconds()
            rounds = cfg.max_resample_rounds if cfg.dynamic_sampling else 0
            rollouts = collect(stream, make_game, sampler, cfg.batch_size, cfg.group_size, rounds)
            metrics = rollout_metrics(rollouts.played, len(rollouts.kept))
            for key, seconds in extra_seconds().items():
                metrics[f"time/{key}_s"] = seconds - services_before.get(key, 0.0)
            metrics["time/rollout_s"] = rollouts.seconds
            metrics["throughput/tokens_per_s"] = metrics["tokens/sampled"] / max(rollouts.seconds, 1e-9)
            log_rollouts(rollout_log, step + 1, rollouts.played, cfg)
            start = time.perf_counter()
            if rollouts.kept:
                rewards_P_G = torch.tensor([g.rewards for g in rollouts.kept], dtype=torch.float)
                advantages_D = grpo.group_advantages(rewards_P_G, cfg.std_scaling).flatten()
                episodes: list[Episode] = [e for g in rollouts.kept for e in g.episodes]
                batch = collate(episodes, advantages_D, pad_id, constraint)
                metrics.update(update(cfg, accelerator, model, optimizer, batch, weight_sync is not None))
                finite = math.isfinite(metrics["optim/loss"]) and math.isfinite(metrics["optim/grad_norm"])
            else:
                # Never a silent no-op: say so, and count it.
                log.warning("step %d: every group had zero reward spread; no update", step + 1)
                finite = True
            metrics["optim/skipped"] = float(not rollouts.kept or not finite)
            if rollouts.kept and finite:
                optimizer.step()
                state.nan_streak = 0
            elif not finite:
                optimizer.zero_grad(set_to_none=True)
                state.nan_streak += 1
                log.warning(
                    "step %d: non-finite loss or gradient, step skipped (%d in a row)",
                    step + 1,
                    state.nan_streak,
                )
            if rollouts.kept and finite:
                scheduler.step()  # the schedule counts updates, so skipped steps do not shorten it
                _sync_weights(weight_sync, accelerator, model, step + 1)
            metrics["optim/lr"] = scheduler.get_last_lr()[0]
            metrics["time/update_s"] = time.perf_counter() - start
            state.step = step + 1
            if accelerator.is_main_process:
                writer.write(state.step, metrics)
            bar.set_postfix(
                reward=f"{metrics['reward/mean']:.3f}", sim=f"{metrics.get('game/similarity', 0):.3f}"
            )
            if state.nan_streak >= cfg.nan_patience:
                raise UserError(
                    f"{state.nan_streak} steps in a row had a non-finite loss or gradient (nan_patience="
                    f"{cfg.nan_patience}); lower learning_rate or check the data. The last checkpoint in "
                    f"{run_dir / 'checkpoints'} is intact."
                )
            if accelerator.is_main_process and (
                state.step % cfg.save_steps == 0 or state.step == cfg.max_steps
            ):
                save_checkpoint(run_dir, state, accelerator.unwrap_model(model), optimizer, scheduler)
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).save_pretrained(str(run_dir / "adapter"), selected_adapters=[ADAPTER])
    return state


def build_sampler(
    cfg: Config, policy: PeftModel, tokenizer, constraint: Constraint
) -> tuple[Sampler, AdapterSync | None]:
    """The in-process sampler, or a vLLM server's with the adapter sync that keeps it current."""
    from emoji_rl.generate import stop_token_id
    from emoji_rl.rl.rollout.hf import HFSampler

    if cfg.engine == "hf":
        sampler = HFSampler(
            policy,
            tokenizer,
            constraint,
            cfg.temperature,
            cfg.max_new_tokens,
            cfg.batch_size * cfg.group_size,
            cfg.min_emoji,
            cfg.max_emoji,
        )
        return sampler, None
    from emoji_rl.rl.endpoint import Endpoint, wait_for_server
    from emoji_rl.rl.rollout.vllm import AdapterSync, VLLMSampler

    wait_for_server(cfg.vllm_url, cfg.vllm_wait_s)
    endpoint = Endpoint(cfg.vllm_url, cfg.vllm_api_key_env, cfg.vllm_timeout_s)
    sampler = VLLMSampler(
        endpoint,
        cfg.vllm_served_name,
        stop_token_id(tokenizer),
        temperature=cfg.temperature,
        max_new_tokens=cfg.max_new_tokens,
        min_emoji=cfg.min_emoji,
        max_emoji=cfg.max_emoji,
    )
    asyncio.run(sampler.verify())
    return sampler, AdapterSync(sampler, cfg.output_dir, cfg.vllm_served_name, cfg.vllm_adapter_keep)


@dataclass
class GameSetup:
    """What the loop needs of a game: a builder of games, the records it reads, the constraint the
    sender samples under (None: free text), and the seconds spent in its services."""

    make_game: Callable[[dict[str, str]], Game]
    records: list[dict[str, str]]
    constraint: EmojiConstraint | None
    seconds: Callable[[], dict[str, float]]
    description: str


def _records(path: str, key: str, hint: str) -> list[dict[str, str]]:
    records = read_jsonl(path, hint=hint)
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise UserError(f"{path}:{number}: record has no non-empty string `{key}`")
    return records


def retrieval_setup(cfg: Config, tokenizer, runtime: models.Runtime, vocab_size: int) -> GameSetup:
    from emoji_rl.emoji.constraint import compile_emoji_grammar
    from emoji_rl.rl.games.retrieval import RetrievalBuilder, RetrievalRules
    from emoji_rl.rl.judge import make_judge
    from emoji_rl.rl.reward import RewardWeights, Similarity

    records = _records(cfg.train_data, "target", "make it with `emoji-rl rl-prompts`")
    constraint = compile_emoji_grammar(tokenizer, cfg.min_emoji, cfg.max_emoji, vocab_size=vocab_size)
    judge = make_judge(
        cfg.judge,
        cfg.judge_view,
        cfg.judge_model,
        runtime=runtime,
        url=cfg.judge_url,
        api_key_env=cfg.judge_api_key_env,
    )
    similarity = Similarity(models.load_embedder(cfg.similarity_model, device=runtime.device))
    weights = RewardWeights(cfg.success_bonus, cfg.turn_cost, cfg.format_penalty, cfg.repetition_penalty)
    rules = RetrievalRules(cfg.max_turns, cfg.tau, cfg.min_emoji, cfg.max_emoji, weights)
    builder = RetrievalBuilder(tokenizer, judge, similarity, rules)
    return GameSetup(
        builder, records, constraint, lambda: dict(builder.seconds), f"retrieval, judge {judge.describe()}"
    )


def wordle_setup(cfg: Config, tokenizer) -> GameSetup:
    from emoji_rl.rl.games.wordle import WordleBuilder, WordleRules
    from emoji_rl.rl.games.wordle_reward import Curriculum, CurriculumTracker

    records = _records(cfg.train_data, "answer", "make it with `emoji-rl wordle-data`")
    tracker = (
        CurriculumTracker(Curriculum(threshold=cfg.curriculum_threshold, window=cfg.curriculum_window))
        if cfg.curriculum
        else None
    )
    builder = WordleBuilder(tokenizer, WordleRules(max_turns=cfg.max_turns), tracker)
    return GameSetup(builder, records, None, dict, "wordle" + (" with curriculum" if cfg.curriculum else ""))


def main(cfg: Config) -> None:
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    run_dir = Path(cfg.output_dir)
    if run_dir.exists() and any(run_dir.iterdir()) and not cfg.resume:
        raise UserError(
            f"{run_dir} already holds a run: pass --resume true to continue it, or another --output_dir"
        )
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
    width = policy.get_output_embeddings().weight.shape[0]
    game = (
        wordle_setup(cfg, tokenizer)
        if cfg.game == "wordle"
        else retrieval_setup(cfg, tokenizer, runtime, width)
    )
    sampler, weight_sync = build_sampler(cfg, policy, tokenizer, "grammar" if game.constraint else "none")
    log.info("%s; %d prompts; B=%d G=%d", game.description, len(game.records), cfg.batch_size, cfg.group_size)
    state = train(
        cfg,
        policy,
        tokenizer,
        game.constraint,
        sampler,
        game.make_game,
        game.records,
        game.seconds,
        weight_sync,
    )
    print(
        f"grpo: {state.step} steps; adapter in {run_dir / 'adapter'}, metrics in {run_dir / 'metrics.jsonl'}"
    )
