"""Picking up a killed `sft` run: the checkpoint to go on from (a save cut short set aside), what of
the run's counts the Trainer does not restore itself (metrics lines, TRL's token count, the loss before
the checkpoint), and ending without a step more a run whose last checkpoint is its last step.

metrics.jsonl's lines are the Trainer's logs (the metrics callback), several at one step: the
training line, an evaluation, and at the end the closing summary and the final evaluation."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.errors import UserError
from emoji_rl.sft.loss import logged_loss_sum

if TYPE_CHECKING:
    from transformers.trainer_utils import TrainOutput
    from trl import SFTTrainer

logger = logging.getLogger(__name__)


def trainer_state(checkpoint: str | Path) -> dict:
    """The checkpoint's trainer_state.json: its step and log history (read once by a resumed run)."""
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text())


def _saved_whole(checkpoint: Path) -> bool:
    """Whether the Trainer finished saving `checkpoint`: it writes trainer_state.json last."""
    try:
        return "global_step" in trainer_state(checkpoint)
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


def logged_lines(saved: dict | None, logged: list[dict]) -> int:
    """How many first lines of metrics.jsonl a resumed run keeps (`logged`: its whole lines; `saved`:
    the checkpoint's `trainer_state`, None without one): those the checkpoint's log history holds (one
    line per entry), and after them what the killed run logged that the resumed run would log again
    the same, rather than redo it: with no checkpoint, the evaluation before training
    (`evaluated_at_start`), and for a run that ended at its checkpoint, the closing summary, which
    holds the time the training took (`finish_from` logs none then)."""
    if saved is None:
        return int(evaluated_at_start(logged))
    count = len(saved["log_history"])
    if count < len(logged) and is_summary(logged[count], saved["global_step"]):
        count += 1
    return count


def evaluated_at_start(logged: list[dict]) -> bool:
    """Whether metrics.jsonl's whole lines (`logged`) begin with the evaluation before training."""
    return bool(logged) and logged[0]["step"] == 0 and "eval/loss" in logged[0]


def is_summary(line: dict, step: int) -> bool:
    """Whether a metrics.jsonl line is the Trainer's closing summary of a run that ended at `step`."""
    return line["step"] == step and "train/train_runtime" in line


def restore_token_count(trainer: SFTTrainer, saved: dict) -> None:
    """TRL (1.16, pinned) counts `num_tokens` from the start of the process, not of the run, so a
    resumed run would log it from 0 again; start it at the count the checkpoint's log history ends with."""
    if not hasattr(trainer, "_total_train_tokens"):
        raise RuntimeError("TRL renamed SFTTrainer._total_train_tokens: update restore_token_count")
    counts = [entry["num_tokens"] for entry in saved["log_history"] if "num_tokens" in entry]
    if counts:
        trainer._total_train_tokens = counts[-1]


def resume_point(saved: dict) -> tuple[int, float]:
    """The checkpoint's step and the training loss summed over the steps up to it (`saved`: its
    `trainer_state`): what `answer_loss_trainer`'s `resumed` takes to log the whole run's closing
    `train_loss`."""
    return saved["global_step"], logged_loss_sum(saved["log_history"], saved["global_step"])


def planned_steps(trainer: SFTTrainer) -> int:
    """The optimizer steps the run takes in all, as the Trainer counts them (`max_steps`, or the epochs'
    worth of steps)."""
    return trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())[-1]


def finish_from(trainer: SFTTrainer, checkpoint: str, summary: dict | None) -> TrainOutput:
    """Take a run whose last checkpoint is its last step to where `train()` would have left it: the
    checkpoint's adapter weights loaded and the closing summary logged, no step trained. (Resumed
    there, the Trainer would train one step more before it looks at `max_steps`.) `summary`: the one
    metrics.jsonl kept of the killed run (`logged_lines`), which is not logged again; without it the
    summary holds no time, since this call trains nothing."""
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
    if summary is not None:
        metrics = {key.removeprefix("train/"): value for key, value in summary.items() if key != "step"}
    else:
        # The keys of the Trainer's own summary but its speeds; `log` makes the loss the whole run's.
        metrics = {"total_flos": trainer.state.total_flos, "train_loss": 0.0}
        trainer.log(metrics)
    return TrainOutput(trainer.state.global_step, metrics["train_loss"], metrics)
