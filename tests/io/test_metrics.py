"""metrics.jsonl's writer: names every tracker can store, and TensorBoard after a resume that redoes a
line of the checkpoint's own step."""

from __future__ import annotations

import json
import time

import pytest

from emoji_rl.io.metrics import MetricsWriter, folder_clashes, read_metrics
from emoji_rl.io.trackers import TrackerConfig


def test_folder_clashes_finds_each_name_that_another_has_as_a_folder():
    names = [
        "eval/reward",
        "eval/reward/contrast",
        "eval/reward/format",
        "reward/mean",
        "reward/contrast/mean",
    ]
    assert folder_clashes(names) == [
        ("eval/reward", "eval/reward/contrast"),
        ("eval/reward", "eval/reward/format"),
    ]
    assert folder_clashes(["a", "a/b/c", "a/b"]) == [("a", "a/b"), ("a", "a/b/c"), ("a/b", "a/b/c")]
    # A name that only begins like another is no folder of it.
    assert folder_clashes(["eval/reward", "eval/rewards/x", "eval/reward_x"]) == []


@pytest.mark.parametrize("earlier", [True, False], ids=["in an earlier line", "in the same line"])
def test_a_name_that_is_the_folder_of_another_is_refused_before_its_line_is_written(tmp_path, earlier):
    with MetricsWriter(tmp_path, trackers=TrackerConfig(report_to=["none"])) as writer:
        writer.write(1, {"eval/reward": 0.5} if earlier else {"eval/similarity": 0.25})
        line = {"eval/reward/contrast": 1.0} if earlier else {"eval/reward": 0.5, "eval/reward/contrast": 1.0}
        with pytest.raises(ValueError, match="'eval/reward' is also the folder of 'eval/reward/contrast'"):
            writer.write(2, line)
    assert [row["step"] for row in read_metrics(tmp_path)] == [1]


def test_a_resumed_writer_checks_new_names_against_the_kept_lines(tmp_path):
    none = TrackerConfig(report_to=["none"])
    with MetricsWriter(tmp_path, trackers=none) as writer:
        writer.write(1, {"game/similarity": 0.5})
    resumed = MetricsWriter(tmp_path, resume_from_step=1, trackers=none)
    with resumed, pytest.raises(ValueError, match="'game/similarity' is also the folder"):
        resumed.write(2, {"game/similarity/best": 0.5})


def _next_second() -> None:
    """TensorBoard reads a run's event files in name order. A name begins with the second the writer
    was made in and ends with a counter of the process (which sorts 10 before 9): a resumed writer made
    in the killed one's second could be read first, which a resume in its own process, later, never is."""
    time.sleep(1.01 - time.time() % 1)


def test_tensorboard_holds_each_point_once_when_a_line_of_the_checkpoints_step_is_redone(tmp_path):
    """sft's last checkpoint at its last step: the killed run logged the step's training line, then a
    line the checkpoint does not know (an evaluation after it). The resume keeps the first line only
    (`keep_lines`) and logs the second again: TensorBoard forgets the checkpoint's step, gets its kept
    line again, then the redone one, each point once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path) as writer:
        writer.write(1, {"train/loss": 1.0})
        writer.write(2, {"train/loss": 0.5})
        writer.write(2, {"eval/loss": 0.75})
    _next_second()
    with MetricsWriter(tmp_path, resume_from_step=2, keep_lines=2) as writer:
        writer.write(2, {"eval/loss": 0.7})

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, pytest.approx(0.7))]
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2, 2]


def test_tensorboard_gets_a_kept_line_the_killed_run_wrote_to_metrics_jsonl_only(tmp_path):
    """A kill between a line reaching metrics.jsonl and reaching TensorBoard (the file is written
    first): sft's closing summary after its last checkpoint, which the resume keeps and does not log
    again. TensorBoard gets it from the kept lines, once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path) as writer:
        writer.write(1, {"train/loss": 1.0})
        writer.write(2, {"train/loss": 0.5})
    with (tmp_path / "metrics.jsonl").open("a") as killed:
        killed.write(json.dumps({"step": 2, "train/train_runtime": 9.0}) + "\n")
    _next_second()
    with MetricsWriter(tmp_path, resume_from_step=2, keep_lines=3) as writer:
        writer.write(2, {"eval/loss": 0.7})

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/train_runtime")] == [(2, 9.0)]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(1, 1.0), (2, 0.5)]
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(2, pytest.approx(0.7))]
