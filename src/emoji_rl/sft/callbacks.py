"""The Trainer callbacks of the `sft` stage: every log as a line of metrics.jsonl (keys named as
transformers' tracker callbacks name them: TensorBoard, wandb, trackio), and on resume the learning
rate set from this run's schedule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import TrainerCallback


def jsonl_metrics_callback(path: Path) -> TrainerCallback:
    """A callback that appends each Trainer log (train and eval) as one JSON line, on the main process.
    On resume, the stage (`train.main`) first drops the lines the checkpoint does not know
    (`keep_first_lines`)."""
    from transformers import TrainerCallback
    from transformers.integrations.integration_utils import rewrite_logs

    class JsonlMetrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            # The trackers' own names (`loss` -> `train/loss`, `eval_loss` -> `eval/loss`), so a line
            # and a tracker's point compare key for key.
            row = {"step": state.global_step, **rewrite_logs(logs)}
            with path.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")

    return JsonlMetrics()


def scheduled_lr_callback() -> TrainerCallback:
    """A callback that sets the learning rate from this run's schedule at the step a run resumes from
    (`follow_schedule`): the Trainer restores the optimizer's rate as the checkpoint's run left it."""
    from transformers import TrainerCallback

    from emoji_rl.lm.training import follow_schedule

    class ScheduledLR(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            if optimizer is not None and lr_scheduler is not None:
                follow_schedule(optimizer, lr_scheduler)

    return ScheduledLR()
