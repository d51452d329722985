"""`emoji-rl sft`: LoRA SFT of the sender on (message, emoji) chats with TRL's SFTTrainer and PEFT.

Loss on the answer only: each record is rendered with the shared chat template (`template.chat_ids`),
and the tokens after the generation prompt (the emoji, end of turn) carry the loss
(`completion_only_loss`). The defaults are seed 001's: LoRA r=32, lr 5e-4 with linear decay, Adam betas
(0.9, 0.95), effective batch 128, 1 epoch. bf16 and flash-attn 2 are used when the GPU has them
(`models.pick_runtime`, logged); a CPU trains in fp32.

    emoji-rl sft --config configs/cpu/sft.yaml                       # embedded SmolLM2, a few minutes
    emoji-rl sft --config configs/gpu/sft.yaml                       # Qwen3.5-4B, one GPU
    NGPUS=8 launch/train_sft.sh                                      # accelerate launch, DDP (or STRATEGY=fsdp)
    torchrun --nproc_per_node 8 -m emoji_rl.cli sft --config configs/gpu/sft.yaml   # DDP without accelerate
    emoji-rl sft --config configs/gpu/sft.yaml --resume true         # go on from the last checkpoint

The run directory (`output_dir`) holds config.yaml, metrics.jsonl, TensorBoard logs under runs/,
checkpoint-N/ and, at the end, adapter/: a PEFT LoRA adapter (adapter_config.json +
adapter_model.safetensors) that `PeftModel.from_pretrained` and vLLM's `--lora-modules` load.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import os
import shutil
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml

from emoji_rl.config import save_config
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import keep_first_lines
from emoji_rl.lm import lora, models
from emoji_rl.lm.training import warn_if_fsdp_ignored
from emoji_rl.sft.data import Overlong, encode_file, to_dataset

if TYPE_CHECKING:
    from peft import LoraConfig
    from transformers import PreTrainedModel, TrainerCallback
    from transformers.trainer_utils import TrainOutput
    from trl import SFTConfig, SFTTrainer

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"
METRICS_FILE = "metrics.jsonl"


@dataclass
class Config:
    """LoRA SFT of the sender with TRL's SFTTrainer; field names follow TRL's SFTConfig."""

    # --- core ---
    model: str = field(
        default=models.SMOLLM2, metadata={"help": "model spec: hub id, local dir or embedded:NAME"}
    )
    train_data: str = field(default="data/sft_train.jsonl", metadata={"help": "SFT chats, JSONL"})
    eval_data: str | None = field(
        default="data/sft_test.jsonl",
        metadata={"help": "held-out chats for the eval loss, JSONL; none to skip evaluation"},
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
    save_steps: int = field(default=200, metadata={"help": "optimizer steps between checkpoints"})
    save_total_limit: int | None = field(
        default=2, metadata={"help": "checkpoints kept (oldest deleted first); none keeps all"}
    )
    sft_overrides: list[str] | None = field(
        default=None,
        metadata={
            "help": "other TRL SFTConfig fields as KEY=VALUE (VALUE read as YAML), e.g. optim=adamw_torch_fused; "
            "a key SFTConfig does not know is an error"
        },
    )

    def __post_init__(self) -> None:
        for name in ("learning_rate", "lora_r", "lora_alpha", "max_length", "per_device_train_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)} must be > 0")
        if self.effective_batch_size is not None and self.gradient_accumulation_steps is not None:
            raise ValueError(
                f"effective_batch_size={self.effective_batch_size} and gradient_accumulation_steps="
                f"{self.gradient_accumulation_steps} both set the batch: set one, the other to none"
            )
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout} must be in [0, 1)")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ValueError("set max_steps > 0 or num_train_epochs > 0: there is nothing to train otherwise")
        if not self.lora_target_modules:
            raise ValueError("lora_target_modules is empty: LoRA needs at least one module to adapt")


# --- TRL config -------------------------------------------------------------------------------------


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


def build_sft_config(cfg: Config, runtime: models.Runtime, world_size: int) -> SFTConfig:
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
        # A fresh run only: on resume the Trainer would evaluate again at the checkpoint's step, a line
        # the uninterrupted run does not have.
        "eval_on_start": has_eval and not cfg.resume,
        "save_strategy": "steps",
        "save_steps": cfg.save_steps,
        "save_total_limit": cfg.save_total_limit,
        "report_to": ["tensorboard"],
        "seed": cfg.seed,
        "data_seed": cfg.seed,
        # Every LoRA weight takes part in every forward pass; the Trainer's default (True without
        # activation checkpointing) costs DDP an extra autograd traversal per step, and a warning.
        "ddp_find_unused_parameters": False,
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


# --- metrics ----------------------------------------------------------------------------------------


def metric_key(key: str) -> str:
    """Trainer log keys as slash namespaces, the same rule TensorBoard's callback applies, so the JSONL
    and TensorBoard agree: `eval_loss` -> `eval/loss`, `loss` -> `train/loss`."""
    if key == "epoch":
        return key
    if key.startswith("eval_"):
        return "eval/" + key.removeprefix("eval_")
    return "train/" + key


def jsonl_metrics_callback(path: Path) -> TrainerCallback:
    """A callback that appends each Trainer log (train and eval) as one JSON line, on the main process.
    On resume, `main` first drops the lines the checkpoint does not know (`keep_first_lines`)."""
    from transformers import TrainerCallback

    class JsonlMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            row = {"step": state.global_step, **{metric_key(k): v for k, v in logs.items()}}
            with path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")

    return JsonlMetrics()


# --- loss -------------------------------------------------------------------------------------------


def own_loss_blocker(
    args: SFTConfig, runtime: models.Runtime, world_size: int, padding_free: bool
) -> str | None:
    """Why this run keeps TRL's loss instead of `answer_loss_trainer`'s, or None when it can use it.

    TRL's answer-only loss projects the answer tokens through a tiled LM head that runs as Triton
    kernels on a GPU and as plain torch code elsewhere: on 2 cores it took half of a 5.7 s step of 8
    SmolLM2 chats (docs/DESIGN.md §5). Ours is the same loss and the same logged metrics, computed
    on a CPU with the shared prompt run once (`shared_prefix`), in the cases that loss covers."""
    if runtime.device != "cpu":
        return "TRL's fused head on a GPU"
    if world_size > 1:
        return "several processes: DDP/FSDP allow one forward pass per backward"
    if args.activation_checkpointing:
        return "activation checkpointing recomputes layers, which would extend the prefix's cache twice"
    if padding_free:
        return "padding-free batches have no shared opening"
    if args.loss_type != "nll" or args.label_smoothing_factor:
        return f"loss_type={args.loss_type}, label_smoothing_factor={args.label_smoothing_factor}"
    return None


def answer_loss_trainer() -> type[SFTTrainer]:
    """TRL's SFTTrainer whose training and eval loss, when `own_loss` is set, is the mean negative
    log-likelihood of the answer tokens from `shared_prefix.kept_logits`, logging what TRL logs
    (entropy, mean_token_accuracy, num_tokens). tests/sft/test_answer_loss.py holds it to TRL's own.
    When `resumed` is set, its closing `train_loss` is the whole run's (`whole_run_loss`)."""
    import torch
    from trl import SFTTrainer

    from emoji_rl.decode.shared_prefix import kept_logits

    class AnswerLossTrainer(SFTTrainer):
        own_loss = False
        resumed: tuple[int, float] | None = None  # the checkpoint's step and `logged_loss_sum`

        def log(self, logs, *args, **kwargs):
            if "train_loss" in logs and self.resumed is not None:
                step, before = self.resumed
                logs["train_loss"] = whole_run_loss(before, step, logs["train_loss"], self.state.global_step)
            super().log(logs, *args, **kwargs)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if return_outputs or not self.own_loss:  # the logits for compute_metrics: TRL's path
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            mode = "train" if self.model.training else "eval"
            labels = inputs["labels"]
            predicts_answer = labels[:, 1:] != -100  # the logits at t score the token at t + 1
            keep = torch.nn.functional.pad(predicts_answer, (0, 1))
            targets = labels[:, 1:][predicts_answer]
            logits = kept_logits(
                model, inputs["input_ids"], inputs["attention_mask"], keep, share_prefix=True
            ).float()
            count = len(targets) if num_items_in_batch is None else num_items_in_batch
            loss = torch.nn.functional.cross_entropy(logits, targets, reduction="sum") / torch.as_tensor(
                count
            ).clamp(min=1)
            with torch.no_grad():
                logp = logits.log_softmax(-1)
                entropy = -(logp.exp() * logp).sum(-1)
                top1 = logits.argmax(-1) == targets
            metrics = self._metrics[mode]
            metrics["entropy"].append(entropy.mean().item() if len(targets) else 0.0)
            metrics["mean_token_accuracy"].append(top1.float().mean().item() if len(targets) else 0.0)
            if mode == "train":
                self._total_train_tokens += int(inputs["attention_mask"].sum())
            metrics["num_tokens"] = [self._total_train_tokens]
            return loss

    return AnswerLossTrainer


def logged_loss_sum(log_history: list[dict], up_to: int) -> float:
    """The training loss summed over the steps up to `up_to`, from a Trainer's log history: each `loss`
    line is the mean over the steps since the line before. Exact when `up_to` is a logging step (the
    steps after the last line before it are in no line)."""
    total, last = 0.0, 0
    for entry in log_history:
        if "loss" in entry and entry["step"] <= up_to:
            total += entry["loss"] * (entry["step"] - last)
            last = entry["step"]
    return total


def whole_run_loss(before: float, resumed_at: int, call_loss: float, global_step: int) -> float:
    """The mean training loss over a resumed run's `global_step` steps. The Trainer's closing
    `train_loss` is the mean over the steps its own `train()` call took (`call_loss`, over
    `global_step - resumed_at` steps); `before` is the loss summed over the steps before them."""
    return (before + call_loss * (global_step - resumed_at)) / max(global_step, 1)


def scheduled_lr_callback() -> TrainerCallback:
    """A callback that sets the learning rate from this run's schedule at the step a run resumes from
    (`follow_schedule`): the Trainer restores the optimizer's rate as the checkpoint's run left it."""
    from transformers import TrainerCallback

    from emoji_rl.rl.checkpoint import follow_schedule

    class ScheduledLR(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            if optimizer is not None and lr_scheduler is not None:
                follow_schedule(optimizer, lr_scheduler)

    return ScheduledLR()


# --- stage ------------------------------------------------------------------------------------------


def _saved_whole(checkpoint: Path) -> bool:
    """Whether the Trainer finished saving `checkpoint`: it writes trainer_state.json last."""
    try:
        return "global_step" in json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False


def _checkpoints(output_dir: Path) -> list[Path]:
    """The Trainer's checkpoint-N directories, newest first."""
    numbered = [
        p for p in output_dir.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit() and p.is_dir()
    ]
    return sorted(numbered, key=lambda p: int(p.name.split("-", 1)[1]), reverse=True)


def last_whole_checkpoint(output_dir: Path, set_aside: bool) -> Path | None:
    """The newest checkpoint-N the Trainer finished saving. Newer ones it did not finish (the process
    killed, or the disk full, during the save) are skipped with a warning, and with `set_aside`
    renamed to `incomplete-save-N`, out of the way of the Trainer's own checkpoint names."""
    for checkpoint in _checkpoints(output_dir):
        if _saved_whole(checkpoint):
            return checkpoint
        aside = checkpoint.with_name("incomplete-save-" + checkpoint.name.split("-", 1)[1])
        logger.warning(
            "%s was not saved whole (no readable trainer_state.json: the save was cut short); %s",
            checkpoint,
            f"set aside as {aside.name}" if set_aside else "skipped",
        )
        if set_aside:
            shutil.rmtree(aside, ignore_errors=True)
            checkpoint.rename(aside)
    return None


def checkpoint_to_resume(output_dir: Path, resume: bool, is_main: bool = True) -> str | None:
    """The checkpoint to go on from; a fresh run must not silently mix with an earlier one's checkpoints.
    `--resume true` with none starts at step 0, as `grpo --resume true` does: a pipeline passes it on
    every run, the first and one that died before its first checkpoint alike (docs/DESIGN.md §12).
    A checkpoint whose save was cut short is set aside (by the main process) and the one before used."""
    if not output_dir.is_dir():
        last = None
    elif resume:
        last = last_whole_checkpoint(output_dir, set_aside=is_main)
    else:
        last = next(iter(_checkpoints(output_dir)), None)
    if resume and last is None:
        logger.warning("--resume: no checkpoint-N in %s, starting from step 0", output_dir)
    if not resume and last is not None:
        raise UserError(
            f"{output_dir} already holds {last.name}: pass --resume true to go on from it, "
            "or choose another --output_dir"
        )
    return str(last) if last is not None else None


def _trainer_state(checkpoint: str) -> dict:
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text())


def logged_lines(checkpoint: str | None) -> int:
    """How many metrics lines a run keeps: those its checkpoint's log history holds (the JSONL callback
    writes one per entry), or none for a fresh run (not even the step-0 eval of an earlier attempt
    that died before its first checkpoint)."""
    return 0 if checkpoint is None else len(_trainer_state(checkpoint)["log_history"])


def planned_steps(trainer: SFTTrainer) -> int:
    """The optimizer steps the run takes in all, as the Trainer counts them (`max_steps`, or the epochs'
    worth of steps)."""
    return trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())[-1]


def finish_from(trainer: SFTTrainer, checkpoint: str) -> TrainOutput:
    """Take a run whose last checkpoint is its last step to where `train()` would have left it: the
    checkpoint's adapter weights loaded and the closing summary logged, no step trained. (Resumed
    there, the Trainer would train one step more before it looks at `max_steps`.)"""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState
    from transformers.trainer_utils import TrainOutput

    loaded = set_peft_model_state_dict(
        trainer.model, load_file(Path(checkpoint) / "adapter_model.safetensors")
    )
    if loaded.unexpected_keys:
        raise UserError(
            f"{checkpoint}: adapter weights this model has no place for: {loaded.unexpected_keys[:3]}"
        )
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    # The keys of the Trainer's own summary; no step trained in this call, and `log` makes the loss
    # the whole run's.
    metrics = {
        "train_runtime": 0.0,
        "train_samples_per_second": 0.0,
        "train_steps_per_second": 0.0,
        "total_flos": trainer.state.total_flos,
        "train_loss": 0.0,
    }
    trainer.log(metrics)
    return TrainOutput(trainer.state.global_step, metrics["train_loss"], metrics)


def restore_token_count(trainer: SFTTrainer, checkpoint: str) -> None:
    """TRL (1.16, pinned) counts `num_tokens` from the start of the process, not of the run, so a
    resumed run would log it from 0 again; start it at the count the checkpoint's log history ends with."""
    if not hasattr(trainer, "_total_train_tokens"):
        raise RuntimeError("TRL renamed SFTTrainer._total_train_tokens: update restore_token_count")
    counts = [
        entry["num_tokens"] for entry in _trainer_state(checkpoint)["log_history"] if "num_tokens" in entry
    ]
    if counts:
        trainer._total_train_tokens = counts[-1]


def main(cfg: Config) -> None:
    # --- run dir, runtime, TRL config (all checks before any model loads)
    output_dir = Path(cfg.output_dir)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    is_main = int(os.environ.get("RANK", "0")) == 0
    checkpoint = checkpoint_to_resume(output_dir, cfg.resume, is_main)
    runtime = models.pick_runtime(dtype=cfg.dtype)
    args = build_sft_config(cfg, runtime, world_size)
    if runtime.device.startswith("cuda") and runtime.attn_implementation != "flash_attention_2":
        logger.info(
            "flash-attn 2 does not import (see the warning above) or dtype is fp32: attention runs on sdpa"
        )
    logger.info(
        "runtime: %s; %d process(es) x %d per device x %d accumulation = %d sequences per step",
        runtime.describe(),
        world_size,
        args.per_device_train_batch_size,
        args.gradient_accumulation_steps,
        world_size * args.per_device_train_batch_size * args.gradient_accumulation_steps,
    )
    if is_main:
        save_config(cfg, output_dir)
        # The steps after the checkpoint are redone, so the lines a dead run logged after it go.
        keep_first_lines(output_dir / METRICS_FILE, logged_lines(checkpoint))

    # --- data: validated and tokenized up front, so a bad line fails before the model loads
    tokenizer = models.load_tokenizer(cfg.model)
    train_set = to_dataset(encode_file(tokenizer, cfg.train_data, cfg.max_length, cfg.overlong))
    eval_set = (
        to_dataset(encode_file(tokenizer, cfg.eval_data, cfg.max_length, cfg.overlong))
        if cfg.eval_data
        else None
    )
    logger.info("data: %d train, %d eval examples", len(train_set), len(eval_set) if eval_set else 0)

    # --- model: left on the CPU; the Trainer places it on this process's device (DDP, FSDP)
    model = models.load_base_model(cfg.model, runtime)
    trainer = answer_loss_trainer()(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
        peft_config=lora_config(cfg, model),
        callbacks=[jsonl_metrics_callback(output_dir / METRICS_FILE), scheduled_lr_callback()],
    )
    models.warn_if_slow_linear_attention(model, runtime)
    # TRL decides padding-free (padding_free, or packing with a bfd strategy, in sft_overrides).
    models.check_padding_free(trainer.padding_free, model, "sft_overrides")
    blocker = own_loss_blocker(args, runtime, world_size, trainer.padding_free)
    trainer.own_loss = blocker is None
    logger.info(
        "loss: %s", "the shared prompt once, the LM head on answer tokens" if blocker is None else blocker
    )
    state = trainer.accelerator.state
    logger.info(
        "distributed: %s, %d process(es), mixed precision %s",
        state.distributed_type.value,
        state.num_processes,
        state.mixed_precision,
    )
    warn_if_fsdp_ignored(state.distributed_type.value, logger)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    logger.info(
        "LoRA r=%d on %s: %.2fM trainable parameters",
        cfg.lora_r,
        sorted(trainer.model.peft_config["default"].target_modules),
        trainable / 1e6,
    )

    # --- train, evaluate, save
    if checkpoint is not None:
        restore_token_count(trainer, checkpoint)
        saved = _trainer_state(checkpoint)
        trainer.resumed = (saved["global_step"], logged_loss_sum(saved["log_history"], saved["global_step"]))
    start = time.monotonic()
    if checkpoint is not None and trainer.resumed[0] >= planned_steps(trainer):
        result = finish_from(trainer, checkpoint)
    else:
        result = trainer.train(resume_from_checkpoint=checkpoint)
    seconds = time.monotonic() - start
    eval_loss = trainer.evaluate()["eval_loss"] if eval_set is not None else float("nan")
    adapter_dir = output_dir / ADAPTER_DIR
    trainer.save_model(str(adapter_dir))  # every rank calls it: FSDP gathers the shards, rank 0 writes
    if is_main:
        logger.info(
            "sft: %d steps in %.0f s, train loss %.4f, eval loss %.4f; adapter at %s",
            result.global_step,
            seconds,
            result.metrics["train_loss"],  # the whole run's (`log`), where training_loss is the call's
            eval_loss,
            adapter_dir,
        )
