"""Tables a person reads in the trackers (a step's episodes): read back from wandb's offline files,
trackio's store and TensorBoard's events."""

from __future__ import annotations

import json

from tests.trackers import trackio_rows, wandb_runs

from emoji_rl.io.metrics import MetricsWriter, markdown_table
from emoji_rl.io.trackers import TrackerConfig
from emoji_rl.rl.rollout.metrics import EPISODE_COLUMNS, episode_table

ROWS = [["the cat sleeps", 0.25], ["a|b\nc", 1.0]]


def test_a_table_reaches_wandb_trackio_and_tensorboard_at_its_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    cfg = TrackerConfig(report_to=["tensorboard", "wandb", "trackio"], run_name=f"tables-{tmp_path.name}")
    with MetricsWriter(run, trackers=cfg) as writer:
        writer.write(1, {"reward/mean": 0.5})
        writer.table(1, "episodes", ["target", "reward"], ROWS)
        writer.write(2, {"reward/mean": 0.6})

    [(_, history)] = wandb_runs(run)
    [row] = [r for r in history if "episodes/path" in r]
    assert row["_step"] == 1 and row["reward/mean"] == 0.5  # one row: the step's numbers and its table
    [files] = run.glob("wandb/offline-run-*/files")
    table = json.loads((files / row["episodes/path"]).read_text())
    assert table["columns"] == ["target", "reward"] and table["data"] == ROWS

    [point] = [p for p in trackio_rows(cfg.project, cfg.run_name) if "episodes" in p]
    assert point["step"] == 1
    assert point["episodes"]["_value"] == [{"target": t, "reward": r} for t, r in ROWS]

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    [text] = events.Tensors("episodes/text_summary")
    assert text.step == 1 and text.tensor_proto.string_val[0].decode() == markdown_table(
        ["target", "reward"], ROWS
    )
    assert "| a\\|b<br>c | 1 |" in markdown_table(["target", "reward"], ROWS)  # one row, its pipe kept


def test_an_episode_row_shows_each_turn_of_the_games_log_and_the_sampler_version():
    record = {
        "step": 3,
        "target": "pizza night",
        "rollout": 1,
        "reward": 0.5,
        "advantage": -0.25,
        "turns": [
            {"emoji": "🍕🌙", "guess": "a late dinner", "similarity": 0.41234},
            {"emoji": "🍕👥", "guess": "pizza with friends", "similarity": 0.8, "sampler_version": 2},
        ],
    }
    rows = episode_table([record, {**record, "rollout": 2}], limit=1)
    assert len(rows) == 1 and len(rows[0]) == len(EPISODE_COLUMNS)
    step, target, rollout, turns, reward, advantage, version = rows[0]
    assert (step, target, rollout, reward, advantage, version) == (3, "pizza night", 1, 0.5, -0.25, 2)
    assert turns == (
        "1. emoji: 🍕🌙; guess: a late dinner; similarity: 0.412\n"
        "2. emoji: 🍕👥; guess: pizza with friends; similarity: 0.800"
    )
    assert len(episode_table([record] * 3, limit=None)) == 3
