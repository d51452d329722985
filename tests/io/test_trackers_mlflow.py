"""mlflow, made by accelerate's MLflowTracker, read back with mlflow's own client from a file store in
the test's folder: every line of metrics.jsonl at its step, and after a real kill -9 and a resume the
same mlflow run with each step once."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.trackers import mlflow_points

from emoji_rl.errors import UserError
from emoji_rl.io.metrics import MetricsWriter, read_metrics
from emoji_rl.io.trackers import STATE_FILE, TrackerConfig

ROOT = Path(__file__).resolve().parents[2]

# The stage's first process: steps 1 and 2 logged, then killed with SIGKILL either once step 3's first
# line is logged everywhere, or between metrics.jsonl's line for step 3 and mlflow's (the tracker's
# write kills the process instead).
KILLED = """
import os, signal, sys
from emoji_rl.io.metrics import MetricsWriter

from tests.io.test_trackers_mlflow import Stage

writer = MetricsWriter(sys.argv[1], trackers=Stage(report_to=["mlflow"], run_name="killed"))
for step in (1, 2):
    writer.write(step, {"loss": 1.0 / step})
if sys.argv[2] == "between metrics.jsonl and mlflow":
    [mlflow] = writer._forward
    mlflow.write = lambda step, metrics: os.kill(os.getpid(), signal.SIGKILL)
writer.write(3, {"loss": 1.0 / 3})
os.kill(os.getpid(), signal.SIGKILL)
"""


@dataclass
class Stage(TrackerConfig):
    """A stage's config: its trackers' fields and one that a resume changes."""

    resume: bool = False


@pytest.fixture
def store(tmp_path, monkeypatch):
    """An mlflow store of the test's own, so the experiment holds this test's runs only."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())


def _runs(project: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient()
    return client.search_runs([client.get_experiment_by_name(project).experiment_id])


def test_mlflow_gets_each_line_at_its_step_and_the_config_in_the_run_trackers_json_keeps(store, tmp_path):
    run = tmp_path / "run"
    cfg = TrackerConfig(report_to=["mlflow"], project="mlflow-test", run_name="first")
    with MetricsWriter(run, trackers=cfg) as writer:
        writer.write(1, {"reward/mean": 0.5, "optim/kl": math.nan, "note": "text"})
        writer.table(1, "episodes", ["target"], [["the cat sleeps"]])  # mlflow's tracker has no tables
        writer.write(2, {"reward/mean": 0.75, "optim/kl": 0.125, "game/success@0.5": 1.0})

    kept = json.loads((run / STATE_FILE).read_text())
    [mlflow_run] = _runs("mlflow-test")
    assert mlflow_run.info.run_id == kept["mlflow_run_id"] and mlflow_run.info.run_name == "first"
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["report_to"] == "['mlflow']"
    assert mlflow_points(kept["mlflow_run_id"], "reward/mean") == [(1, 0.5), (2, 0.75)]
    assert mlflow_points(kept["mlflow_run_id"], "optim/kl") == [(2, 0.125)]  # NaN: null, not a point
    # A character mlflow refuses in a name is replaced, as TRL's mlflow callback replaces it.
    assert mlflow_points(kept["mlflow_run_id"], "game/success_0.5") == [(2, 1.0)]
    assert set(mlflow_run.data.metrics) == {"reward/mean", "optim/kl", "game/success_0.5"}


@pytest.mark.parametrize(
    ("killed", "checkpoint"),
    [("between metrics.jsonl and mlflow", 3), ("between two lines of step 3", 2)],
)
def test_a_resume_after_a_kill_continues_the_mlflow_run_with_each_step_once(
    store, tmp_path, killed, checkpoint
):
    """Each step once, and each line of a step: step 3 has a second line (`eval`), which the killed
    run never logged; the resume from step 2's checkpoint logs both, and mlflow is sent the second."""
    run = tmp_path / "run"
    dead = subprocess.run([sys.executable, "-c", KILLED, str(run), killed], cwd=ROOT, env=dict(os.environ))
    assert dead.returncode == -9
    kept = json.loads((run / STATE_FILE).read_text())["mlflow_run_id"]
    # mlflow holds step 3 only if the kill came after its write: a resume sends it the rest.
    held = [1, 2] if killed == "between metrics.jsonl and mlflow" else [1, 2, 3]
    assert [step for step, _ in mlflow_points(kept, "loss")] == held

    cfg = Stage(report_to=["mlflow"], run_name="ignored on resume", resume=True)
    with MetricsWriter(run, resume_from_step=checkpoint, trackers=cfg) as writer:
        for step in range(checkpoint + 1, 7):
            writer.write(step, {"loss": 1.0 / step})
            if step == 3:
                writer.write(step, {"eval": 0.5})

    second = [(3, "eval")] if checkpoint < 3 else []
    lines = [(1, "loss"), (2, "loss"), (3, "loss"), *second, (4, "loss"), (5, "loss"), (6, "loss")]
    assert [(row["step"], *row.keys() - {"step"}) for row in read_metrics(run)] == lines
    assert mlflow_points(kept, "loss") == [(step, 1.0 / step) for step in range(1, 7)]
    assert mlflow_points(kept, "eval") == [(3, 0.5)] * len(second)
    [mlflow_run] = _runs("emoji-rl")
    assert mlflow_run.info.run_id == kept and mlflow_run.info.run_name == "killed"
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["resume"] == "False"  # mlflow keeps the params the run started with


def test_a_kill_inside_the_file_stores_append_leaves_a_run_the_resume_continues(store, tmp_path):
    """SIGKILL inside mlflow's append to a metric's file: a new metric's file left empty, an old one's
    last line cut. mlflow then refuses the whole run ("Metric ... is malformed") and would read the cut
    line as a point; the resume cuts the files back to whole lines and logs again what was cut."""
    from mlflow import MlflowClient

    run = tmp_path / "run"
    dead = subprocess.run(
        [sys.executable, "-c", KILLED, str(run), "after step 3"], cwd=ROOT, env=dict(os.environ)
    )
    assert dead.returncode == -9
    kept = json.loads((run / STATE_FILE).read_text())["mlflow_run_id"]
    [metrics] = (tmp_path / "mlruns").glob(f"*/{kept}/metrics")
    loss = metrics / "loss"
    loss.write_bytes(loss.read_bytes()[:-4])  # step 3's line cut inside its value
    (metrics / "eval").write_bytes(b"")  # opened for its first point, nothing written
    with pytest.raises(ValueError, match="Metric 'eval' is malformed"):
        MlflowClient().get_run(kept)

    with MetricsWriter(run, resume_from_step=2, trackers=Stage(report_to=["mlflow"], resume=True)) as writer:
        for step in range(3, 5):
            writer.write(step, {"loss": 1.0 / step})
            if step == 3:
                writer.write(step, {"eval": 0.5})
    assert mlflow_points(kept, "loss") == [(step, 1.0 / step) for step in range(1, 5)]
    assert mlflow_points(kept, "eval") == [(3, 0.5)]


def test_mlflow_added_on_resume_gets_a_new_run_with_every_line(store, tmp_path):
    run = tmp_path / "run"
    with MetricsWriter(run, trackers=TrackerConfig(report_to=["none"])) as writer:
        writer.write(1, {"loss": 1.0})
        writer.write(2, {"loss": 0.5})
    with MetricsWriter(run, resume_from_step=2, trackers=TrackerConfig(report_to=["mlflow"])) as writer:
        writer.write(3, {"loss": 0.25})

    kept = json.loads((run / STATE_FILE).read_text())["mlflow_run_id"]
    assert mlflow_points(kept, "loss") == [(1, 1.0), (2, 0.5), (3, 0.25)]


def test_a_kept_mlflow_run_the_store_does_not_hold_is_named(store, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / STATE_FILE).write_text(
        json.dumps({"id": "abcd1234", "project": "emoji-rl", "name": "gone", "mlflow_run_id": "0" * 32})
    )
    with pytest.raises(UserError, match=f"keeps mlflow run {'0' * 32}, which mlflow at file:"):
        MetricsWriter(run, trackers=TrackerConfig(report_to=["mlflow"]))


def test_a_run_from_before_the_held_out_rename_resumes_in_a_new_mlflow_run_under_the_new_names(
    store, tmp_path
):
    """A GRPO run of before #62: its mlflow file store holds `eval/reward` as a file (where the killed
    run's `eval/reward/contrast` failed), so no `eval/reward/mean` can go beside it. The resume renames
    metrics.jsonl's lines, and a new mlflow run gets every line; the old one stays as it was."""
    from mlflow import MlflowClient

    from emoji_rl.rl.held_out import current_names

    run = tmp_path / "run"
    run.mkdir()
    old = {
        "step": 1,
        "reward/mean": 0.5,
        "eval/reward": 0.25,
        "eval/reward/contrast": -0.1,
        "eval/turns": 1.0,
    }
    (run / "metrics.jsonl").write_text(json.dumps(old) + "\n")
    client = MlflowClient()
    experiment = client.create_experiment("emoji-rl")
    before = client.create_run(experiment).info.run_id
    client.log_metric(before, "eval/reward", 0.25, step=1)
    (run / STATE_FILE).write_text(
        json.dumps({"id": "abcd1234", "project": "emoji-rl", "name": "old", "mlflow_run_id": before})
    )

    cfg = Stage(report_to=["mlflow"], resume=True)
    with MetricsWriter(run, resume_from_step=1, trackers=cfg, rename=current_names) as writer:
        writer.write(2, {"reward/mean": 0.75, "eval/reward/mean": 0.5, "eval/reward/contrast/mean": 0.1})

    renamed = {"step": 1, "reward/mean": 0.5, "eval/reward/mean": 0.25, "eval/reward/contrast/mean": -0.1}
    assert read_metrics(run)[0] == {**renamed, "eval/turns": 1.0}
    now = json.loads((run / STATE_FILE).read_text())["mlflow_run_id"]
    assert now != before and set(client.get_run(before).data.metrics) == {"eval/reward"}
    assert mlflow_points(now, "eval/reward/mean") == [(1, 0.25), (2, 0.5)]
    assert mlflow_points(now, "eval/reward/contrast/mean") == [(1, -0.1), (2, 0.1)]
