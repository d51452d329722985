"""The `grpo` stage's settings: the trainer's own (`TrainConfig`), read by the loop (`rl/train.py`), the
trainer (`rl/trainer.py`, which hands the update its `UpdateSettings`), the schedule
(`rl/rollout/schedule.py`) and the wiring (`rl/engine.py`), and the game's, which `--game NAME` adds
(`config_class`: the game's `GameConfig` fields beside the trainer's, one flat dataclass, so that YAML
and the command line set either alike; the game's setup receives its own part, typed, and what it may
know of the run, `game_context`). Its own module, below them all, so that none of them imports another
only to know the settings' type."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from emoji_rl.config import override, peek
from emoji_rl.decode.generate import SamplingConfig
from emoji_rl.io.endpoint import ServerWaitConfig
from emoji_rl.io.trackers import TrackerConfig, check_trackers
from emoji_rl.lm.models import ModelConfig
from emoji_rl.lm.processes import ProcessConfig
from emoji_rl.play import registry
from emoji_rl.play.spec import GAME_HELP, GameContext, PolicyServer, stage_config
from emoji_rl.rl import grpo

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.lm.models import Runtime
    from emoji_rl.play.types import Record
    from emoji_rl.rl.update import UpdateSettings


@dataclass
class TrainConfig(SamplingConfig, ProcessConfig, ModelConfig, TrackerConfig, ServerWaitConfig):
    """Multi-turn GRPO of a LoRA policy on a game (`--game`; `--game NAME --help` lists its fields).

    The trainer's half of grpo's Config (`config_class`); the game's `GameConfig` is the other, and
    gives the `max_turns` and `off_policy_blocker` read here."""

    # --- core ---
    game: str = field(default=registry.DEFAULT_GAME, metadata=GAME_HELP)
    init_adapter: str | None = field(
        default=None,
        metadata={
            "help": "LoRA adapter to start from (the SFT output); none = a fresh adapter",
            "input": True,
        },
    )
    reference: Literal["init", "base"] = field(
        default="init",
        metadata={"help": "KL reference: `init` = the starting adapter, frozen; `base` = the base model"},
    )
    train_data: str = field(
        default="data/rl_train.jsonl", metadata={"help": "the game's training records, JSONL", "input": True}
    )
    output_dir: str = field(
        default="runs/grpo", metadata={"help": "run directory: config, metrics, checkpoints"}
    )
    max_steps: int = field(default=20, metadata={"help": "optimizer steps to run"})
    batch_size: int = field(
        default=4,
        metadata={
            "help": "prompts per step over all processes (B), split evenly among them: a multiple of the "
            "number of processes; gpu: 32"
        },
    )
    group_size: int = field(
        default=4, metadata={"help": "rollouts per prompt (G >= 2); seed 003: G=2 wastes 75% of steps"}
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW step size; gpu: 5e-6 (seed 001)"})
    beta: float = field(default=0.01, metadata={"help": "KL coefficient; 0 skips the reference"})
    kl_in: Literal["loss", "reward"] = field(
        default="loss",
        metadata={
            "help": "where the KL to the reference goes: `loss` = beta x k3 KL added to the loss (TRL); "
            "`reward` = beta x k1 KL per token subtracted from the advantages (the original's, as tinker-cookbook)"
        },
    )
    # With init_adapter, the adapter decides these three; a value given here must agree with it.
    lora_r: int | None = field(
        default=None, metadata={"help": "LoRA rank of a fresh adapter (none: 16); init_adapter: its own"}
    )
    lora_alpha: int | None = field(
        default=None, metadata={"help": "LoRA alpha of a fresh adapter (none: 32); init_adapter: its own"}
    )
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "module names that get LoRA in a fresh adapter (none: as sft's default); init_adapter: its own"
        },
    )
    # --- sampling (and the min_emoji, max_emoji and max_new_tokens fields) ---
    temperature: float = override(
        SamplingConfig, "temperature", help="sender sampling temperature; 0 = greedy (the original: 0.8)"
    )
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
        metadata={"help": "its --served-model-name (POLICY_NAME); adapters load as NAME-<session>-v<step>"},
    )
    vllm_api_key_env: str | None = field(
        default="POLICY_API_KEY",
        metadata={"help": "env var holding the policy server's key; unset sends none"},
    )
    vllm_adapter_keep: int | None = field(
        default=None,
        metadata={
            "help": "adapter versions kept loaded and on disk (>= max_off_policy_steps + 1, <= the server's "
            "--max-cpu-loras); none: max(2, max_off_policy_steps + 1), what launch/serve_policy.sh sizes for",
            "min": 1,
        },
    )
    vllm_timeout_s: float = field(default=300.0, metadata={"help": "seconds per request before a retry"})
    max_off_policy_steps: int = field(
        default=0,
        metadata={
            "help": "engine vllm: K, how many versions the rollouts may trail the weights they train: step "
            "t is sampled by the adapter of step t-K on the server while the trainer updates on step t-1 "
            "(0: lockstep; gpu: 1). The policy server needs --max-loras >= K+1 (MAX_OFF_POLICY_STEPS)",
            "min": 0,
        },
    )
    vllm_importance_sampling_cap: float = field(
        default=2.0,
        metadata={
            "help": "engine vllm: each sampled token is weighed by min(p_trainer / p_sampler, this): the "
            "correction for the server's numerics and for an older adapter (TRL's name and default)",
            "min": 1.0,
        },
    )
    # --- advanced ---
    scale_rewards: grpo.ScaleRewards = field(
        default="group",
        metadata={"help": "advantage scaling: group std (GRPO), batch std, none (Dr. GRPO; the original)"},
    )
    baseline: grpo.Baseline = field(
        default="group",
        metadata={
            "help": "what each seat's reward is measured against (docs/DESIGN.md §14): group = its group's mean "
            "(GRPO: no state, and a flat group teaches nothing); ema = the seat's moving average over the "
            "steps (SPIRAL's role-conditioned baseline: a flat group still learns how far it stands from the "
            "seat's average; takes scale_rewards batch or none). Either way per seat, so that one seat's "
            "reward scale never moves the other's advantages"
        },
    )
    baseline_decay: float = field(
        default=0.95,
        metadata={
            "help": "baseline ema: b <- decay * b + (1 - decay) * the step's mean reward of the seat, in [0, 1) "
            "(SPIRAL's 0.95: about 20 steps of memory)"
        },
    )
    loss_type: grpo.LossType = field(
        default="dapo",
        metadata={
            "help": "loss reduction over tokens: dapo (token mean), grpo (mean per episode), dr_grpo (sum / "
            "rows x max tokens), sum (the original's)"
        },
    )
    epsilon: float = field(default=0.2, metadata={"help": "PPO clip: the ratio is kept above 1 - epsilon"})
    epsilon_high: float | None = field(
        default=None,
        metadata={"help": "PPO clip above 1 (DAPO clip-higher: 0.28); none: epsilon, as in TRL"},
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "draw more prompts to replace groups with zero reward spread (DAPO); each process refills "
            "its share of batch_size"
        },
    )
    max_resample_rounds: int = field(
        default=2, metadata={"help": "extra draws per step with dynamic_sampling"}
    )
    per_device_train_batch_size: int = field(
        default=8,
        metadata={"help": "episodes per forward/backward pass (gradient accumulation inside a step)"},
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={
            "help": "recompute each decoder layer's activations in the backward pass instead of keeping "
            "them: long multi-turn episodes (six turns of free text) fit in memory, for about a third more update compute"
        },
    )
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "gradient clipping norm; 0: no clipping (the original's)"}
    )
    # The optimizer is torch's AdamW; with weight_decay 0 it is Adam. Names as in transformers'
    # TrainingArguments, which TRL's configs inherit.
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2 (the original: 0.95)"})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon"})
    weight_decay: float = field(
        default=0.01, metadata={"help": "AdamW decoupled weight decay (torch's default; the original: 0)"}
    )
    nan_patience: int = field(default=3, metadata={"help": "stop after this many non-finite steps in a row"})
    lr_scheduler_type: Literal["constant", "linear", "cosine"] = field(
        default="constant", metadata={"help": "learning-rate schedule over max_steps"}
    )
    warmup_steps: int = field(default=0, metadata={"help": "linear warm-up steps"})
    save_steps: int = field(
        default=10, metadata={"help": "checkpoint every N steps (and at the end)", "min": 1}
    )
    seed: int = field(default=0, metadata={"help": "random seed (prompt order, sampling, judge)"})
    resume: bool = field(default=False, metadata={"help": "continue from the last checkpoint in output_dir"})
    # Held-out evaluation as it trains (rl/held_out.py); TRL's eval_steps, SkyRL's eval_before_train.
    eval_data: str | None = field(
        default=None,
        metadata={
            "help": "held-out records of the game, JSONL, for eval_steps and eval_before_train",
            "input": True,
        },
    )
    eval_steps: int = field(
        default=0,
        metadata={
            "help": "every N steps the policy plays eval_data greedily; the game's final metrics and those "
            "its eval stage compares go to metrics.jsonl and the trackers as eval/* (0: never)",
            "min": 0,
        },
    )
    eval_before_train: bool = field(
        default=False, metadata={"help": "evaluate once before the first step too (logged at step 0)"}
    )
    eval_max_examples: int = field(
        default=64, metadata={"help": "the first N records of eval_data (0: all)", "min": 0}
    )
    # TRL's GRPO names; the table is what rollouts.jsonl holds, for reading in the tracker as it trains.
    log_completions: bool = field(
        default=True,
        metadata={
            "help": "each step, a table of its episodes in the trackers (wandb, trackio and clearml tables, "
            "TensorBoard text): target, each turn's game log, reward, advantage, sampler version"
        },
    )
    num_completions_to_print: int | None = field(
        default=8, metadata={"help": "episodes in each step's table (none: every episode of the step)"}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if (self.eval_steps or self.eval_before_train) and not self.eval_data:
            raise ValueError(
                "eval_steps and eval_before_train need eval_data: the game's held-out records (JSONL)"
            )
        if self.num_completions_to_print is not None and self.num_completions_to_print < 1:
            raise ValueError(
                f"num_completions_to_print={self.num_completions_to_print}: at least 1, or none for all"
            )
        check_trackers(self)  # a tracker that does not import, or a name it refuses, before any work
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1 (prompts per step)")
        if self.group_size < 2:
            raise ValueError(
                f"group_size={self.group_size} must be >= 2: the advantage is reward minus the group mean"
            )
        if self.baseline == "ema" and self.scale_rewards == "group":
            raise ValueError(
                "baseline=ema with scale_rewards=group: a group whose rewards are all equal has std 0, where a "
                "moving baseline still gives it an advantage; set scale_rewards to batch or none"
            )
        if not 0.0 <= self.baseline_decay < 1.0:
            raise ValueError(f"baseline_decay={self.baseline_decay} must be in [0, 1)")
        if self.loss_type == "dr_grpo" and self.max_new_tokens <= 0:
            raise ValueError(
                "loss_type=dr_grpo normalizes by max_new_tokens * max_turns: set max_new_tokens > 0"
            )
        if self.max_grad_norm < 0:
            raise ValueError(f"max_grad_norm={self.max_grad_norm} must be >= 0 (0: no clipping)")
        if self.vllm_adapter_keep is None:
            # Every version a step may still sample by, K + 1, and never fewer than 2: the sizes
            # launch/serve_policy.sh gives the server for the same K (--max-loras max(2, K+1)).
            self.vllm_adapter_keep = max(2, self.max_off_policy_steps + 1)
        if self.vllm_adapter_keep < self.max_off_policy_steps + 1:
            raise ValueError(
                f"vllm_adapter_keep={self.vllm_adapter_keep} must be >= max_off_policy_steps + 1 = "
                f"{self.max_off_policy_steps + 1}: the server keeps every version a step still samples by"
            )
        if self.max_off_policy_steps > 0 and self.engine != "vllm":
            raise ValueError(
                f"max_off_policy_steps={self.max_off_policy_steps} needs engine vllm: the in-process engine "
                "samples with the weights being trained, so it cannot run ahead of them (set 0)"
            )
        blocker = self.off_policy_blocker() if self.max_off_policy_steps > 0 else None
        if blocker is not None:
            raise ValueError(
                f"max_off_policy_steps={self.max_off_policy_steps} with game {self.game}: {blocker}"
            )
        if self.reference == "init" and self.init_adapter is None and self.beta > 0:
            self.reference = "base"  # a fresh adapter starts equal to the base model

    def game_context(
        self, tokenizer: PreTrainedTokenizerBase, runtime: Runtime, records: list[Record]
    ) -> GameContext:
        """What the game may know of this run: it plays `records` (`train_data`'s); the policy server,
        with engine vllm."""
        server = PolicyServer(self.vllm_url, self.vllm_served_name) if self.engine == "vllm" else None
        return GameContext.of(self, tokenizer, runtime, records, server)

    @property
    def clip_range(self) -> tuple[float, float]:
        """(epsilon below 1, epsilon above 1) of the PPO clip; epsilon_high unset is epsilon, as in TRL."""
        return self.epsilon, self.epsilon if self.epsilon_high is None else self.epsilon_high

    def update_settings(self, importance_weights: bool = False) -> UpdateSettings:
        """What `update` reads of these settings; `importance_weights`: the sampler is not the trainer
        (vLLM), so its tokens are weighed by the truncated probability ratio."""
        # Here, not at the top: the settings load without the update's model and grammar imports.
        from emoji_rl.rl.update import UpdateSettings

        return UpdateSettings(
            loss_type=self.loss_type,
            clip_range=self.clip_range,
            beta=self.beta,
            kl_in=self.kl_in,
            reference=self.reference,
            temperature=self.temperature,
            micro_batch=self.per_device_train_batch_size,
            max_tokens=self.max_new_tokens * self.max_turns,
            max_grad_norm=self.max_grad_norm,
            gradient_checkpointing=self.gradient_checkpointing,
            importance_weights=importance_weights,
            importance_sampling_cap=self.vllm_importance_sampling_cap,
        )


@functools.cache
def config_class(game: str) -> type[TrainConfig]:
    """`grpo`'s Config for `game`: the game's fields (its `GameConfig`) beside the trainer's."""
    spec = registry.load(game)
    return stage_config(TrainConfig, spec, doc=f"Multi-turn GRPO on the {game} game: {spec.description}.")


def config_for(argv: list[str]) -> type[TrainConfig]:
    """The Config a command line asks for: its `--game`, or its YAML's `game`, or the default."""
    return config_class(peek(argv, "game") or registry.DEFAULT_GAME)


def grpo_config(**values: Any) -> TrainConfig:
    """A Config from field values, for the game `values["game"]` names (the default's if none)."""
    return config_class(values.get("game", registry.DEFAULT_GAME))(**values)
