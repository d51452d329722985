"""Every tracker holds every step once after a real kill -9 and a resume: the stage run as a user runs
it (`emoji-rl sft` / `grpo` in its own process group), killed between checkpoints, just after one or
while one is being written, and sft between two lines of one step (its training line and its
evaluation) and during its final evaluation, then resumed; wandb's offline files, trackio's store,
mlflow's store and TensorBoard's events read back. wandb and trackio keep what they have not written
yet in memory, so the kill drops it: the resume sends again what each lacks (io/metrics.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.trackers import mlflow_points, trackio_rows, wandb_runs

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
KILL_AFTER = 3  # logged, while the last checkpoint is step 2's (save_steps 2)
# sft evaluates before training and at the end; with eval_steps, also at step 3 (and at the end in
# its loop, before its last checkpoint; without, after it and after the closing summary).
SFT_EVAL_STEPS = {"between two lines of one step": KILL_AFTER}


def _chats(path: Path, words: list[str]) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": f"{w} {w}"}]}
        for w in words
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def _stage_args(stage: str, tmp_path: Path, moment: str) -> list[str]:
    if stage == "sft":
        data = _chats(tmp_path / "chats.jsonl", ["🍕", "🎉", "🐱", "🌧️"])
        held_out, per_pass = data, 32
        if moment in ("between two lines of one step", "during the final evaluation"):
            # An evaluation long enough to be killed inside: 16 chats, one a forward pass.
            words = [f"{emoji} {n}" for emoji in "🍕🎉🐱🌧" for n in range(4)]
            held_out, per_pass = _chats(tmp_path / "held_out.jsonl", words), 1
        return ["sft", "--config", "configs/cpu/sft.yaml", "--train_data", str(data), "--eval_data", str(held_out),
                "--per_device_train_batch_size", "2", "--effective_batch_size", "2", "--lora_r", "4", "--logging_steps", "1",
                "--eval_steps", str(SFT_EVAL_STEPS.get(moment)), "--per_device_eval_batch_size", str(per_pass)]  # fmt: skip
    data = tmp_path / "rl.jsonl"
    targets = ["the cat sleeps on the sofa", "we missed the last train", "pizza night with friends"]
    data.write_text("".join(json.dumps({"target": t}) + "\n" for t in targets))
    return ["grpo", "--config", "configs/cpu/grpo.yaml", "--train_data", str(data), "--judge", "lexicon", "--init_adapter", "none",
            "--max_turns", "1", "--batch_size", "1", "--group_size", "2", "--max_new_tokens", "8"]  # fmt: skip


def _lines(metrics: Path) -> list[dict]:
    """The whole lines of metrics.jsonl."""
    text = metrics.read_text() if metrics.is_file() else ""
    return [json.loads(line) for line in text.splitlines() if line.endswith("}")]


def _moment(stage: str, moment: str, run: Path) -> bool:
    """Whether the run has reached the moment to be killed at: a step logged past its last checkpoint
    (for sft, its training line, while the evaluation of that step runs), the closing summary logged
    while the final evaluation runs, the step-2 checkpoint just written, or that checkpoint being
    written (a moment of milliseconds: missed, the kill lands just after it, still between checkpoints)."""
    lines = _lines(run / "metrics.jsonl")
    if moment == "between checkpoints":
        return any(line["step"] >= KILL_AFTER for line in lines)
    if moment == "between two lines of one step":
        return any(line["step"] == KILL_AFTER and "train/loss" in line for line in lines)
    if moment == "during the final evaluation":
        return any("train/train_runtime" in line for line in lines)
    if stage == "sft":
        written = (run / "checkpoint-2" / "trainer_state.json").is_file()
        return written if moment == "after a checkpoint" else (run / "checkpoint-2").is_dir()
    latest = run / "checkpoints" / "latest"
    if moment == "after a checkpoint":
        return latest.is_file() and latest.read_text().strip() == "step-000002"
    return (run / "checkpoints" / ".step-000002.tmp").is_dir() or latest.is_file()


def _tensorboard_steps(run: Path, key: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars(key)]


@pytest.mark.parametrize(
    ("stage", "moment"),
    [
        ("sft", "between two lines of one step"),
        ("sft", "during the final evaluation"),
        ("sft", "during a save"),
        ("grpo", "between checkpoints"),
        ("grpo", "after a checkpoint"),
    ],
)
def test_every_tracker_holds_every_step_once_after_a_kill(tmp_path, stage, moment, monkeypatch):
    run = tmp_path / "run"
    command = [sys.executable, "-m", "emoji_rl.cli", *_stage_args(stage, tmp_path, moment), "--output_dir", str(run),
               "--max_steps", str(STEPS), "--save_steps", "2", "--report_to", "tensorboard", "wandb", "trackio", "mlflow"]  # fmt: skip
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # this test's runs alone
    # Not this pytest process's wandb service (WANDB_SERVICE, set by a test that ran wandb in process):
    # the kill must take the stage's own wandb process with it, as it does a user's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") or k == "WANDB_MODE"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    log = (tmp_path / "killed.log").open("w")
    killed = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 600
    while not _moment(stage, moment, run):
        assert killed.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline, f"the run did not reach {moment!r} in 10 minutes"
        time.sleep(0.01)
    os.killpg(killed.pid, signal.SIGKILL)  # the stage, wandb's own process, trackio's threads: all at once
    killed.wait()
    if moment in ("between two lines of one step", "during the final evaluation"):
        assert "eval/loss" not in _lines(run / "metrics.jsonl")[-1], "killed after the evaluation, not in it"

    resumed = subprocess.run(
        [*command, "--resume", "true"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    tracker = json.loads((run / "trackers.json").read_text())
    runs = wandb_runs(run)
    # A file killed before wandb wrote its run record holds nothing, and no other run.
    assert {run_id for run_id, _ in runs} - {None} == {tracker["id"]}
    rows = trackio_rows(tracker["project"], tracker["name"])
    # Each key at each step it was logged at, once: the training lines, sft's evaluations and summary.
    steps = (
        {"train/loss": list(range(1, STEPS + 1))}
        if stage == "sft"
        else {"reward/mean": list(range(1, STEPS + 1))}
    )
    if stage == "sft":
        evaluated = [0, *([KILL_AFTER] if moment in SFT_EVAL_STEPS else []), STEPS]
        steps |= {"eval/loss": evaluated, "eval/runtime": evaluated, "train/train_runtime": [STEPS]}
    for key, logged in steps.items():
        assert [m["step"] for m in metrics if key in m] == logged, key
        assert sorted(row["_step"] for _, rows in runs for row in rows if key in row) == logged, key
        assert sorted(row["step"] for row in rows if key in row) == logged, key
        assert _tensorboard_steps(run, key) == logged, key
        assert [step for step, _ in mlflow_points(tracker["mlflow_run_id"], key)] == logged, key
    assert _mlflow_run_ids(tracker["project"]) == [tracker["mlflow_run_id"]]
    if stage == "sft":  # the summary the killed run logged, with the time its training took
        [summary] = [m for m in metrics if "train/train_runtime" in m]
        assert summary["train/train_runtime"] > 0


def _mlflow_run_ids(project: str) -> list[str]:
    from mlflow import MlflowClient

    client = MlflowClient()
    return [r.info.run_id for r in client.search_runs([client.get_experiment_by_name(project).experiment_id])]
