"""The `sft` stage's settings (`Config`, its field names TRL's SFTConfig's) and what TRL and PEFT are
given from them: the SFTConfig, with the KEY=VALUE `sft_overrides` checked against its fields, and the
LoRA config. `Config` is here, not in the stage (`sft/train.py`, which `emoji-rl sft` and its callers
still reach it through), because the builders need it and the stage needs the builders: no two modules
import each other (tests/test_imports.py)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import yaml

from emoji_rl.errors import UserError
from emoji_rl.io.trackers import TrackerConfig, check_trackers
from emoji_rl.lm import lora, models
from emoji_rl.lm.processes import ProcessConfig
from emoji_rl.play.guessing import ReaderViewConfig
from emoji_rl.sft.data import Overlong

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel
    from trl import SFTConfig


@dataclass
class Config(ProcessConfig, models.ModelConfig, TrackerConfig, ReaderViewConfig):
    """LoRA SFT of the sender with TRL's SFTTrainer; field names follow TRL's SFTConfig."""

    # --- core ---
    train_data: str = field(
        default="data/sft_train.jsonl", metadata={"help": "SFT chats, JSONL", "input": True}
    )
    eval_data: str | None = field(
        default="data/sft_test.jsonl",
        metadata={"help": "held-out chats for the eval loss, JSONL; none to skip evaluation", "input": True},
    )
    output_dir: str = field(
        default="runs/sft", metadata={"help": "run directory: config, metrics, checkpoints, adapter/"}
    )
    learning_rate: float = field(
        default=5e-4, metadata={"help": "peak learning rate (seed 001: 5e-4 for LoRA)"}
    )
    lr_scheduler_type: Literal["linear", "cosine", "constant"] = field(
        default="linear",
        metadata={"help": "learning-rate schedule after warmup (seed 001: linear decay to 0)"},
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "passes over train_data (seed 001: 1)"})
    max_steps: int = field(default=-1, metadata={"help": "optimizer steps; > 0 overrides num_train_epochs"})
    per_device_train_batch_size: int = field(
        default=16,
        metadata={"help": "sequences per device per forward pass (a memory knob, not a recipe knob)"},
    )
    effective_batch_size: int | None = field(
        default=128,
        metadata={
            "help": "sequences per optimizer step over all devices (seed 001: 128); sets gradient accumulation "
            "from per_device_train_batch_size and the number of processes; none to set "
            "gradient_accumulation_steps yourself"
        },
    )
    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={"help": "forward passes per optimizer step; only with effective_batch_size none"},
    )
    lora_r: int = field(default=32, metadata={"help": "LoRA rank (seed 001: 32)"})
    lora_alpha: int = field(
        default=32, metadata={"help": "LoRA scale numerator; the update is scaled by alpha/r"}
    )
    max_length: int = field(
        default=512, metadata={"help": "tokens per example, prompt included; see overlong for longer ones"}
    )
    seed: int = field(default=0, metadata={"help": "seed for LoRA init, data order and dropout"})
    resume: bool = field(
        default=False,
        metadata={
            "help": "go on from the last checkpoint-N in output_dir (optimizer, LR, RNG); none there: start at step 0"
        },
    )

    # --- advanced ---
    adam_beta1: float = field(default=0.9, metadata={"help": "Adam beta1 (seed 001: 0.9)"})
    adam_beta2: float = field(
        default=0.95, metadata={"help": "Adam beta2 (seed 001: 0.95; shorter memory than the usual 0.999)"}
    )
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay on the LoRA weights"})
    warmup_steps: float = field(
        default=0.0, metadata={"help": "linear warmup: steps if >= 1, else a fraction of all steps"}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping norm; 0 disables"})
    lora_dropout: float = field(default=0.0, metadata={"help": "dropout on the LoRA input, in [0, 1)"})
    # The projections only, as the seed's recipe: vLLM 0.33 would serve embed_tokens and lm_head too (its
    # Llama and Qwen3.5 declare them in `embedding_modules`), each a rank x vocabulary LoRA.
    lora_target_modules: list[str] = field(
        default_factory=lambda: list(lora.DEFAULT_TARGETS),
        metadata={
            "help": "module names (last path component) that get LoRA; default: the attention, linear-attention "
            "and MLP projections, those the model has; every kind of decoder layer needs LoRA on its attention"
        },
    )
    overlong: Overlong = field(
        default="drop",
        metadata={
            "help": "examples longer than max_length: drop them, or truncate them (the answer loses its end, "
            "end of turn included); counted in a warning either way"
        },
    )
    dtype: Literal["auto", "float32", "bfloat16"] = field(
        default="auto",
        metadata={"help": "auto: bf16 on a GPU that has it, else fp32 (a bf16 CPU step is ~15x slower)"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward: less memory, ~30% slower"}
    )
    per_device_eval_batch_size: int = field(
        default=32, metadata={"help": "sequences per device when evaluating"}
    )
    logging_steps: int = field(default=10, metadata={"help": "optimizer steps between metric lines"})
    eval_steps: int | None = field(
        default=None, metadata={"help": "optimizer steps between eval-loss runs; none: at start and end only"}
    )
    # TRL's save_steps below 1 is a fraction of the run, which an int field cannot hold; no saving is
    # TRL's save_strategy no, which a resumable stage does not offer.
    save_steps: int = field(default=200, metadata={"help": "optimizer steps between checkpoints", "min": 1})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "checkpoints kept (oldest deleted first); none keeps all"}
    )
    reader_share: float = field(
        default=0.0,
        metadata={
            "help": "share of train_data's (message, emoji) records also taught reversed, as the reader's "
            "guessing chat (shown reader_view) answered by the message, for a policy that plays both "
            "seats (game both_seats): trained on the sender's chats alone, it answers the reader's in "
            "emoji. 0: the sender's chats only"
        },
    )
    sft_overrides: list[str] | None = field(
        default=None,
        metadata={
            "help": "other TRL SFTConfig fields as KEY=VALUE (VALUE read as YAML), e.g. optim=adamw_torch_fused; "
            "a key SFTConfig does not know is an error"
        },
    )

    def __post_init__(self) -> None:
        check_trackers(self)  # a tracker that does not import, or a name it refuses, before any work
        for name in ("learning_rate", "lora_r", "lora_alpha", "max_length", "per_device_train_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.effective_batch_size is not None and self.gradient_accumulation_steps is not None:
            raise ValueError(
                f"effective_batch_size={self.effective_batch_size} and gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps} both set the batch: set one, the other to none"
            )
        if not 0.0 <= self.reader_share <= 1.0:
            raise ValueError(f"reader_share={self.reader_share} must be in [0, 1]")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout} must be in [0, 1)")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ValueError("set max_steps > 0 or num_train_epochs > 0: there is nothing to train otherwise")
        if not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty: LoRA needs at least one module to adapt")


def accumulation_steps(cfg: Config, world_size: int) -> int:
    """Forward passes per optimizer step, so that every step sees effective_batch_size sequences."""
    if cfg.effective_batch_size is None:
        return cfg.gradient_accumulation_steps or 1
    per_pass = cfg.per_device_train_batch_size * world_size
    if cfg.effective_batch_size % per_pass:
        raise UserError(
            f"effective_batch_size={cfg.effective_batch_size} is not a multiple of per_device_train_batch_size="
            f"{cfg.per_device_train_batch_size} x {world_size} process(es) = {per_pass}; change one of them"
        )
    return cfg.effective_batch_size // per_pass


def parse_sft_overrides(items: Sequence[str], managed: Collection[str]) -> dict[str, object]:
    """KEY=VALUE items for SFTConfig fields that this stage does not set itself."""
    from trl import SFTConfig

    known = {f.name for f in dataclasses.fields(SFTConfig) if f.init}
    parsed: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"sft_overrides item {item!r} is not KEY=VALUE (e.g. optim=adamw_torch_fused)")
        if key not in known:
            close = difflib.get_close_matches(key, known | {f.name for f in dataclasses.fields(Config)}, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UserError(f"sft_overrides: {key!r} is not a field of TRL's SFTConfig{hint}")
        if key in managed:
            raise UserError(
                f"sft_overrides: {key!r} is set by this stage; use its own field (`emoji-rl sft --help`) instead"
            )
        try:
            parsed[key] = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise UserError(f"sft_overrides: the value of {key!r} is not valid YAML: {value!r}") from err
    return parsed


def build_sft_config(
    cfg: Config, runtime: models.Runtime, world_size: int, evaluate_first: bool = True
) -> SFTConfig:
    """TRL's SFTConfig for this run; `evaluate_first`: evaluate before the first step (with eval_data),
    false for a resume from a checkpoint, or of a run that already logged that evaluation."""
    import torch
    from trl import SFTConfig

    has_eval = cfg.eval_data is not None
    managed: dict[str, object] = {
        "output_dir": cfg.output_dir,
        "learning_rate": cfg.learning_rate,
        "lr_scheduler_type": cfg.lr_scheduler_type,
        "warmup_steps": cfg.warmup_steps,
        "num_train_epochs": cfg.num_train_epochs,
        "max_steps": cfg.max_steps,
        "per_device_train_batch_size": cfg.per_device_train_batch_size,
        "per_device_eval_batch_size": cfg.per_device_eval_batch_size,
        "gradient_accumulation_steps": accumulation_steps(cfg, world_size),
        "adam_beta1": cfg.adam_beta1,
        "adam_beta2": cfg.adam_beta2,
        "weight_decay": cfg.weight_decay,
        "max_grad_norm": cfg.max_grad_norm,
        # Always explicit: SFTConfig defaults to bf16=True even on a CPU, where a step took 155 s
        # against 10 s in fp32 (docs/DESIGN.md §5).
        "bf16": runtime.dtype == torch.bfloat16,
        "use_cpu": runtime.device == "cpu",
        # transformers 5 renamed gradient_checkpointing to activation_checkpointing (the old name warns).
        "activation_checkpointing": cfg.gradient_checkpointing,
        # Non-reentrant checkpointing works with frozen base weights (LoRA) without extra hooks.
        "activation_checkpointing_kwargs": {"use_reentrant": False} if cfg.gradient_checkpointing else None,
        "max_length": cfg.max_length,
        "completion_only_loss": True,
        "logging_steps": cfg.logging_steps,
        "eval_strategy": "steps" if has_eval and cfg.eval_steps else "no",
        "eval_steps": cfg.eval_steps,
        # Not from a checkpoint: the Trainer would evaluate again at the checkpoint's step, a line the
        # uninterrupted run does not have.
        "eval_on_start": has_eval and evaluate_first,
        "save_strategy": "steps",
        "save_steps": cfg.save_steps,
        "save_total_limit": cfg.save_total_limit,
        # The stage reports to the trackers itself, at metrics.jsonl's step numbers (io/metrics.py):
        # TRL's callbacks would count their own steps and log a resume's redone steps twice.
        "report_to": "none",
        "run_name": cfg.run_name,
        "seed": cfg.seed,
        "data_seed": cfg.seed,
        # Every LoRA weight takes part in every forward pass; the Trainer's default (True without
        # activation checkpointing) costs DDP an extra autograd traversal per step, and a warning.
        "ddp_find_unused_parameters": False,
        # The stage joins the process group first, with this timeout (lm/processes.py); the Trainer's
        # own setting says the same.
        "ddp_timeout": cfg.collective_timeout_s,
    }
    aliases = {"gradient_checkpointing", "gradient_checkpointing_kwargs"}
    overrides = parse_sft_overrides(cfg.sft_overrides or [], managed.keys() | aliases)
    try:
        args = SFTConfig(**managed, **overrides)
    except (ValueError, TypeError) as err:
        raise UserError(f"TRL's SFTConfig rejected the settings: {err}") from err
    # Without bf16/fp16 the Trainer takes mixed precision from ACCELERATE_MIXED_PRECISION, which
    # configs/accelerate/*.yaml set to bf16: a CPU run would autocast to bf16 (~15x slower) while
    # `dtype` chose fp32. `dtype` decides.
    if not (args.bf16 or args.fp16):
        args.mixed_precision = "no"
    return args


def lora_config(cfg: Config, model: PreTrainedModel) -> LoraConfig:
    from peft import LoraConfig

    return LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=lora.resolve_targets(model, cfg.lora_target_modules, "lora_target_modules"),
        bias="none",
        task_type="CAUSAL_LM",
    )
