"""What wandb, trackio and mlflow hold after a run, read back from their own files: wandb's offline run
files (the transaction log of protobuf records that `wandb sync` uploads; `io/wandb_file.py` reads
them), trackio's local database and mlflow's store, through mlflow's own client."""

from __future__ import annotations

import uuid
from pathlib import Path

from emoji_rl.io.accelerate_trackers import MLFLOW_REFUSED
from emoji_rl.io.metrics import read_metrics
from emoji_rl.io.wandb_file import history


def wandb_runs(wandb_dir: Path) -> list[tuple[str, list[dict]]]:
    """Each offline run wandb wrote under `wandb_dir`, oldest first: its run id and its history rows
    (`_step` and the logged values)."""
    return [history(path) for path in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))]


def trackio_rows(project: str, name: str) -> list[dict]:
    """The metric rows of trackio run `name` in its local store ($TRACKIO_DIR): `step` and the values."""
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, name)


def mlflow_points(run_id: str, key: str) -> list[tuple[int, float]]:
    """The (step, value) points mlflow's store ($MLFLOW_TRACKING_URI) holds for `key` in run `run_id`."""
    from mlflow import MlflowClient

    return sorted((m.step, m.value) for m in MlflowClient().get_metric_history(run_id, key))


def assert_mlflow_keeps_every_name(run_dir: Path) -> None:
    """Every metric name a stage logged in `run_dir`'s metrics.jsonl, logged at one step into mlflow's
    file store ($MLFLOW_TRACKING_URI, tests/conftest.py) as the stage's mlflow writer names them, and
    read back. mlflow keeps a metric there as a file at its name's path, so a name that is the folder
    of another fails as it fails a run (`[Errno 20] Not a directory`)."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    names = {
        MLFLOW_REFUSED.sub("_", key)
        for row in read_metrics(run_dir)
        for key, value in row.items()
        if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
    }
    client = MlflowClient()
    run_id = client.create_run(client.create_experiment(f"names-{uuid.uuid4().hex}")).info.run_id
    client.log_batch(run_id, metrics=[Metric(name, 0.0, 0, 1) for name in sorted(names)])
    assert set(client.get_run(run_id).data.metrics) == names
