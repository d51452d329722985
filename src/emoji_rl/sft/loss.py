"""The `sft` stage's answer-only loss: `answer_loss_trainer`, TRL's SFTTrainer with its own loss on a
CPU where that covers the run (`own_loss_blocker`), and the closing `train_loss` of a resumed run taken
over the whole run (`logged_loss_sum`, `whole_run_loss`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from emoji_rl.lm import models

if TYPE_CHECKING:
    from trl import SFTConfig, SFTTrainer


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
    from emoji_rl.lm.models import at_least_fp32

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
            logits = at_least_fp32(
                kept_logits(model, inputs["input_ids"], inputs["attention_mask"], keep, share_prefix=True)
            )
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
