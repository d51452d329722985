"""The Trainer callbacks of the `sft` stage: every log as a line of metrics.jsonl and a point in each
tracker (keys named as transformers' tracker callbacks name them), and on resume the learning rate set
from this run's schedule."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import TrainerCallback

    from emoji_rl.io.metrics import MetricsWriter


def metrics_callback(writer: MetricsWriter) -> TrainerCallback:
    """A callback that hands each Trainer log (train and eval) to the stage's `MetricsWriter`, on the
    main process: a line of metrics.jsonl and a point in each tracker, at the Trainer's global step.
    On resume, the stage's writer first drops the lines the run redoes (`resume.logged_lines`)."""
    from transformers import TrainerCallback
    from transformers.integrations.integration_utils import rewrite_logs

    class Metrics(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if state.is_world_process_zero and logs:
                # The trackers' own names (`loss` -> `train/loss`, `eval_loss` -> `eval/loss`), as
                # transformers' tracker callbacks name them.
                writer.write(state.global_step, rewrite_logs(logs))

    return Metrics()


def scheduled_lr_callback() -> TrainerCallback:
    """A callback that sets the learning rate from this run's schedule at the step a run resumes from
    (`follow_schedule`): the Trainer restores the optimizer's rate as the checkpoint's run left it."""
    from transformers import TrainerCallback

    from emoji_rl.lm.distributed import follow_schedule

    class ScheduledLR(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            if optimizer is not None and lr_scheduler is not None:
                follow_schedule(optimizer, lr_scheduler)

    return ScheduledLR()
