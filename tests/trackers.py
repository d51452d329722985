"""What wandb, trackio and mlflow hold after a run, read back from their own files: wandb's offline run
files (the transaction log of protobuf records that `wandb sync` uploads; `io/wandb_file.py` reads
them), trackio's local database and mlflow's store, through mlflow's own client."""

from __future__ import annotations

from pathlib import Path

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
