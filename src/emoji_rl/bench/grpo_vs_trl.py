"""The `grpo_step_vs_trl` row of `make bench`: one step (rollout + update) of our trainer vs one
`trl.GRPOTrainer` step on one single-turn setting: the same LoRA policy, prompts, B, G, token budget
and reward function. Both sample unconstrained: TRL cannot take our grammar processor, and the grammar
changes how many tokens are sampled, so only the unconstrained step compares like with like.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import TrainerCallback

from emoji_rl.bench.grpo import (
    GROUP_SIZE,
    LEARNING_RATE,
    LORA_ALPHA,
    LORA_R,
    MAX_NEW_TOKENS,
    MICRO_BATCH,
    TARGETS,
    fresh_policy,
    target_records,
)
from emoji_rl.bench.row import Row
from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.lm import models, template
from emoji_rl.play.types import Env, GameSetup, StepResult
from emoji_rl.rl.batch import collate_groups
from emoji_rl.rl.checkpoint import TrainState
from emoji_rl.rl.rollout.collect import Baselines, PromptStream, collect
from emoji_rl.rl.train_config import grpo_config
from emoji_rl.rl.update import update

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOTrainer


def distinct_share(text: str) -> float:
    """The toy reward of the step comparison: distinct characters / characters (0 for no text).
    Continuous, so groups almost never have zero spread: our trainer skips such groups (less work),
    TRL trains on them, and the comparison must not hinge on that."""
    return len(set(text)) / len(text) if text else 0.0


class OneTurnEnv(Env):
    """One sender turn on `target`, rewarded by `distinct_share` of what it wrote."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, target: str) -> None:
        self.tokenizer = tokenizer
        self.target = target

    async def start(self) -> tuple[int, ...]:
        return tuple(template.chat_ids(self.tokenizer, sender_messages(self.target)))

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        text = self.tokenizer.decode(action_ids, skip_special_tokens=True)
        return StepResult(done=True, reward=distinct_share(text))


def _trl_reward(completions: list[list[dict[str, str]]], **_: object) -> list[float]:
    return [distinct_share(completion[0]["content"]) for completion in completions]


class _OurStep:
    """Each call takes one step of our trainer on the one-turn game, as `train.train` does (collect,
    group advantages, collate, `update`, optimizer step) and returns its seconds. Metrics, logs and
    checkpoints are left out, as the TRL side's timed step leaves out its logging."""

    def __init__(self, records: list[dict[str, str]], group_size: int, max_new_tokens: int) -> None:
        from accelerate import Accelerator

        self.cfg = grpo_config(
            batch_size=len(records),
            group_size=group_size,
            max_new_tokens=max_new_tokens,
            max_turns=1,
            beta=0.0,
            lora_r=LORA_R,
            lora_alpha=LORA_ALPHA,
            learning_rate=LEARNING_RATE,
            per_device_train_batch_size=MICRO_BATCH,
        )
        self.tokenizer = models.load_tokenizer(self.cfg.model)
        policy = fresh_policy()
        episodes = len(records) * group_size
        decoding = Decoding("none", self.cfg.temperature, max_new_tokens, batch_size=episodes)
        self.sampler = HFSampler(policy, self.tokenizer, decoding)
        self.accelerator = Accelerator(cpu=True)
        optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=LEARNING_RATE)
        self.model, self.optimizer = self.accelerator.prepare(policy, optimizer)
        self.stream = PromptStream(records, seed=0, state=TrainState())
        self.tokens_per_episode: list[float] = []
        self.groups_kept: list[int] = []

    def __call__(self) -> float:
        start = time.perf_counter()
        rollouts = asyncio.run(
            collect(
                self.stream,
                GameSetup(
                    lambda r: OneTurnEnv(self.tokenizer, r["target"]),
                    self.stream.records,
                    "none",
                    "one turn",
                ),
                self.sampler,
                self.cfg.batch_size,
                self.cfg.group_size,
                Baselines(self.cfg.scale_rewards),
            )
        )
        if rollouts.kept:
            batch = collate_groups(rollouts.kept, self.tokenizer.pad_token_id, None)
            update(self.cfg.update_settings(), self.accelerator, self.model, self.optimizer, batch)
            self.optimizer.step()
        seconds = time.perf_counter() - start
        played = [e for g in rollouts.played for e in g.episodes]
        self.tokens_per_episode.append(sum(len(e.turns[0].action_ids) for e in played) / len(played))
        self.groups_kept.append(len(rollouts.kept))
        return seconds


class _Alternate(TrainerCallback):
    """Times each TRL step (generation, reward, forward/backward, optimizer) and, after it, runs and
    times one of ours: the steps alternate, so load that drifts on a shared machine weighs on both."""

    def __init__(self, our_step: Callable[[], float]) -> None:
        self.our_step = our_step
        self.trl_seconds: list[float] = []
        self.our_seconds: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.trl_seconds.append(time.perf_counter() - self._start)
        self.our_seconds.append(self.our_step())


def _trl_trainer(
    records: list[dict[str, str]], group_size: int, max_new_tokens: int, steps: int, output_dir: str
) -> GRPOTrainer:
    """TRL's GRPOTrainer on the same setting as `_OurStep`, offline: a local model object, no hub, no
    reporting, nothing saved."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    episodes = len(records) * group_size
    micro = min(MICRO_BATCH, episodes)
    args = GRPOConfig(
        output_dir=output_dir,
        max_steps=steps,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=episodes // micro,  # one generation of B x G per optimizer step
        num_generations=group_size,
        max_completion_length=max_new_tokens,
        temperature=1.0,
        beta=0.0,
        loss_type="dapo",  # ours too (the default)
        scale_rewards="group",
        learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        # CPU: fp32 and no gradient checkpointing, as our trainer runs (TRL's defaults are bf16 and on).
        bf16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
    )
    return GRPOTrainer(
        model=fresh_policy(),
        reward_funcs=_trl_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": sender_messages(r["target"])} for r in records]),
        processing_class=models.load_tokenizer(models.SMOLLM2),
    )


def bench_grpo_step_vs_trl(
    prompts: int = len(TARGETS),
    group_size: int = GROUP_SIZE,
    max_new_tokens: int = MAX_NEW_TOKENS,
    timed_steps: int = 3,
) -> list[Row]:
    """Median step time of ours vs TRL's after one warm-up step each (both unconstrained, beta 0,
    the same fresh LoRA adapter, prompts, B, G, token budget, micro-batch and reward)."""
    records = target_records(prompts)
    ours = _OurStep(records, group_size, max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trl_trainer(records, group_size, max_new_tokens, 1 + timed_steps, tmp)
        timer = _Alternate(ours)
        trainer.add_callback(timer)
        trainer.train()
    trl_tokens = [
        log["completions/mean_length"]
        for log in trainer.state.log_history
        if "completions/mean_length" in log
    ]
    print(
        f"  grpo step: ours {[round(s, 2) for s in timer.our_seconds]} s, "
        f"{statistics.mean(ours.tokens_per_episode):.1f} tokens/episode, groups kept {ours.groups_kept}; "
        f"TRL {[round(s, 2) for s in timer.trl_seconds]} s, {statistics.mean(trl_tokens):.1f} tokens/episode; "
        "the first step of each is a warm-up"
    )
    ours_s, trl_s = statistics.median(timer.our_seconds[1:]), statistics.median(timer.trl_seconds[1:])
    ratio = ours_s / trl_s
    return [
        Row(
            f"GRPO step, BxG={prompts * group_size}, unconstrained: ours / TRL",
            f"{ours_s:.2f} s",
            f"{trl_s:.2f} s",
            ratio,
            "<= 1.0x",
            ratio <= 1.0,
        )
    ]
