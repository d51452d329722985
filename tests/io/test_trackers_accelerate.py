"""accelerate's trackers behind `report_to`: the names accelerate and TRL give them, the arguments each of
accelerate's classes is made with, and what a resume gives one whose store cannot be read back (a new
run with every line of metrics.jsonl once), on a tracker of accelerate's GeneralTracker API."""

from __future__ import annotations

import inspect
import sys
import types
from typing import ClassVar

from accelerate.tracking import LOGGER_TYPE_TO_CLASS, GeneralTracker

from emoji_rl.io.accelerate_trackers import init_arguments
from emoji_rl.io.metrics import MetricsWriter
from emoji_rl.io.trackers import TRACKERS, TrackerConfig, tracker_run

OURS = {"tensorboard", "wandb", "trackio"}


def test_report_to_names_every_tracker_accelerate_has_as_trl_names_them():
    from transformers.integrations.integration_utils import INTEGRATION_TO_CALLBACK

    assert set(TRACKERS) == set(LOGGER_TYPE_TO_CLASS)
    # aim is accelerate's alone: TRL (transformers' Trainer) has no aim callback.
    assert set(TRACKERS) - {"aim"} <= set(INTEGRATION_TO_CALLBACK)


def test_each_of_accelerates_classes_takes_the_arguments_it_is_made_with(tmp_path):
    run = tracker_run(tmp_path, TrackerConfig(project="emoji", run_name="first"))
    for name in set(TRACKERS) - OURS:
        made_with = init_arguments(name, run, tmp_path)
        inspect.signature(LOGGER_TYPE_TO_CLASS[name]).bind(**made_with)
    assert init_arguments("mlflow", run, tmp_path) == {
        "experiment_name": "emoji",
        "run_name": "first",
        "run_id": None,
    }
    assert init_arguments("dvclive", run, tmp_path) == {"dir": str(tmp_path / "dvclive")}


class Recorder(GeneralTracker):
    """A tracker of accelerate's API that records what it is given, in place of swanlab's."""

    name = "swanlab"
    requires_logging_directory = False
    made: ClassVar[list[Recorder]] = []

    def __init__(self, run_name: str, **kwargs) -> None:
        super().__init__()
        self.arguments = {"run_name": run_name, **kwargs}
        self.calls: list[tuple] = []
        Recorder.made.append(self)

    @property
    def tracker(self) -> Recorder:
        return self

    def start(self) -> None:
        self.calls.append(("start",))

    def store_init_configuration(self, values: dict) -> None:
        self.calls.append(("config", values["report_to"]))

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.calls.append(("log", step, values))

    def log_table(self, table_name: str, columns=None, data=None, dataframe=None, step=None) -> None:
        self.calls.append(("table", step, table_name, columns, data))

    def finish(self) -> None:
        self.calls.append(("finish",))


def test_a_tracker_without_a_readable_store_gets_a_new_run_with_every_line_on_resume(tmp_path, monkeypatch):
    monkeypatch.setitem(LOGGER_TYPE_TO_CLASS, "swanlab", Recorder)
    monkeypatch.setitem(
        sys.modules, "swanlab", types.ModuleType("swanlab")
    )  # installed, as far as import sees
    monkeypatch.setattr(Recorder, "made", [])
    cfg = TrackerConfig(report_to=["swanlab"], project="emoji")
    run = tmp_path / "run"
    killed = MetricsWriter(run, trackers=cfg)
    for step in (1, 2, 3):
        killed.write(step, {"loss": 1.0 / step, "note": "text"})
    killed.table(3, "episodes", ["target"], [["pizza night"]])
    # Killed: never closed. The resume goes on from the checkpoint at step 2.
    with MetricsWriter(run, resume_from_step=2, trackers=cfg) as resumed:
        resumed.write(3, {"loss": 0.25})

    first, second = Recorder.made
    assert first.arguments == {"run_name": "emoji"}
    assert first.calls[-1] == ("table", 3, "episodes", ["target"], [["pizza night"]])
    assert second.calls == [
        ("start",),
        ("config", ["swanlab"]),
        ("log", 1, {"loss": 1.0}),
        ("log", 2, {"loss": 0.5}),
        ("log", 3, {"loss": 0.25}),
        ("finish",),
    ]
