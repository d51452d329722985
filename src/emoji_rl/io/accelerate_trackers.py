"""report_to's trackers that accelerate's own classes make (`mlflow`, `comet_ml`, `clearml`, `dvclive`,
`aim`, `swanlab`): created with the arguments `Accelerator.init_trackers` gives them (the project, the
logging directory where a class asks for one) and the run's name where the class takes one, then fed
through accelerate's GeneralTracker API (`store_init_configuration`, `log(values, step)`, `finish`)
behind the writer interface MetricsWriter feeds wandb and trackio through (io/metrics.py).

mlflow continues the run trackers.json keeps, and says what its store holds (`held`: the last step, and
the metrics it holds there), so a resume sends it exactly what it lacks, as wandb and trackio. The others start a new run in each
process (dvclive starts its folder over), whose `held` is -1: a resume sends the new run every line of
metrics.jsonl, and the killed process's run keeps what it had as a run of its own.
"""

from __future__ import annotations

import re
from pathlib import Path

from emoji_rl.errors import UserError
from emoji_rl.io.trackers import STATE_FILE, Held, TrackerRun, keep_mlflow_run

# The characters mlflow refuses in a metric's name (game/success@0.5), which TRL's mlflow callback
# (transformers' MLflowCallback) replaces with `_` as this does.
MLFLOW_REFUSED = re.compile(r"[^0-9A-Za-z_\-. :/]")


def init_arguments(name: str, run: TrackerRun, run_dir: str | Path) -> dict:
    """The keyword arguments accelerate's tracker class `name` is made with."""
    return {
        "mlflow": {"experiment_name": run.project, "run_name": run.name, "run_id": run.mlflow_run_id},
        # comet_ml.start's project; comet names the experiment itself.
        "comet_ml": {"run_name": run.project},
        "clearml": {"run_name": run.project, "task_name": run.name},
        # In the run directory, as TensorBoard's events: dvclive's default is the working directory's.
        "dvclive": {"dir": str(Path(run_dir) / "dvclive")},
        "aim": {"run_name": run.name, "logging_dir": str(run_dir), "experiment": run.project},
        "swanlab": {"run_name": run.project},
    }[name]


class AccelerateWriter:
    """Metrics to one of accelerate's trackers at our step numbers. `held`: what the tracker already
    holds of this run (nothing, as in a new run, but for an mlflow run continued)."""

    def __init__(self, name: str, run: TrackerRun, run_dir: str | Path, config: dict) -> None:
        from accelerate import PartialState
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        # accelerate's trackers log through its logger, which refuses to run before the process state
        # exists: the stage's (join_processes made it), or a lone process's outside a stage.
        PartialState()
        self._tracker = LOGGER_TYPE_TO_CLASS[name](**init_arguments(name, run, run_dir))
        self._name = name
        self.held = Held()
        if name == "mlflow" and run.mlflow_run_id is not None:
            mend_mlflow_file_store(run.mlflow_run_id)
            _continue_mlflow_run(self._tracker, run.mlflow_run_id, run_dir)
            # Not the config again: mlflow refuses to change a param once logged, and a resume's
            # differs (resume: true). The run keeps the config it started with.
            self.held = mlflow_held(run.mlflow_run_id)
            return
        self._tracker.start()
        if name == "mlflow":
            keep_mlflow_run(run_dir, run, self._tracker.tracker.info.run_id)
        self._tracker.store_init_configuration(config)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if self._name == "mlflow":
            metrics = {MLFLOW_REFUSED.sub("_", key): value for key, value in metrics.items()}
        lacking = self.held.take(step, metrics)
        if lacking:
            self._tracker.log(lacking, step=step)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        """A table where accelerate's class logs one (clearml); the others have no table to log."""
        log_table = getattr(self._tracker, "log_table", None)
        if log_table is not None and self.held.take(step, {name: rows}):
            log_table(name, columns=columns, data=rows, step=step)

    def close(self, failed: bool = False) -> None:
        self._tracker.finish()


def mend_mlflow_file_store(run_id: str) -> None:
    """A kill inside mlflow's file store's append to a metric's file leaves the file empty or its last
    line cut, and the store then refuses to read the whole run ("Metric ... is malformed"). Each of the
    run's metric files is cut back to its last whole line (an empty one goes): the store then holds
    what it holds whole, `mlflow_held` counts that, and the resume logs the point again."""
    from urllib.parse import urlparse

    import mlflow
    from mlflow.utils.file_utils import local_file_uri_to_path

    uri = mlflow.get_tracking_uri()
    if urlparse(uri).scheme not in ("", "file"):
        return  # a server or a database writes its own records whole
    for metrics in Path(local_file_uri_to_path(uri)).glob(f"*/{run_id}/metrics"):
        for path in [p for p in metrics.rglob("*") if p.is_file()]:
            data = path.read_bytes()
            whole = data[: data.rfind(b"\n") + 1]
            if not whole:
                path.unlink()
            elif whole != data:
                path.write_bytes(whole)


def _continue_mlflow_run(tracker, run_id: str, run_dir: str | Path) -> None:
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        tracker.start()
    except MlflowException as err:
        raise UserError(
            f"{Path(run_dir) / STATE_FILE} keeps mlflow run {run_id}, which mlflow at "
            f"{mlflow.get_tracking_uri()} cannot continue ({err}): point MLFLOW_TRACKING_URI at the store "
            "that holds it, or delete mlflow_run_id there to start a new mlflow run"
        ) from None


def mlflow_held(run_id: str) -> Held:
    """What mlflow's store holds of run `run_id`: its last step and the metrics it holds there. Read
    from the store, not from what a killed process logged, since mlflow may have queued some (its
    async logging)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    latest = {
        key: max(m.step for m in client.get_metric_history(run_id, key))
        for key in client.get_run(run_id).data.metrics
    }
    last = max(latest.values(), default=-1)
    return Held(last, {key for key, step in latest.items() if step == last})
