"""Run metrics: one JSON line per step in `metrics.jsonl` and the same scalars in the trackers that
`report_to` names (TensorBoard, wandb, trackio: `io/trackers.py`; accelerate's, such as mlflow:
`io/accelerate_trackers.py`), at the same step numbers.

Keys are slash-namespaced and stable (`reward/mean`, `optim/kl`, `time/rollout_s`), so runs compare
on a dashboard and in `jq`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import TracebackType

from emoji_rl.config import to_dict
from emoji_rl.io.accelerate_trackers import AccelerateWriter
from emoji_rl.io.jsonl import drop_steps_after
from emoji_rl.io.trackers import TrackerConfig, TrackerRun, TrackioWriter, WandbWriter, resolve, tracker_run


class MetricsWriter:
    """Appends `{"step": n, **metrics}` lines; a resumed run keeps the lines of earlier steps only.

    Every tracker ends with each step once, at metrics.jsonl's step numbers, whatever killed the run
    before and wherever. TensorBoard forgets the redone steps (`purge_step`). wandb's and trackio's
    histories only go forward, and a kill -9 can drop what they held in memory: each says the last
    step it holds (`held`), and the lines of metrics.jsonl after it are sent again before the run goes
    on; a step it holds past the checkpoint keeps the value the dead run gave it, and the redone step
    is not sent twice. mlflow says the same from its store; accelerate's other trackers start a new
    run, which gets every line."""

    def __init__(
        self, run_dir: str | Path, resume_from_step: int = 0, trackers: TrackerConfig | None = None
    ) -> None:
        trackers = trackers or TrackerConfig()
        names = resolve(trackers.report_to)
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Steps after the checkpoint were logged by a run that then died: they are redone, so drop them.
        drop_steps_after(self.path, resume_from_step)
        self._tb = None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_from_step + 1)
        forwarded = [name for name in names if name != "tensorboard"]
        self._forward: list[WandbWriter | TrackioWriter | AccelerateWriter] = []
        if forwarded:
            run = tracker_run(run_dir, trackers)
            config = to_dict(trackers)
            self._forward = [_writer(name, run, run_dir, config) for name in forwarded]
        kept = read_metrics(run_dir) if self._forward and self.path.is_file() else []
        for tracker in self._forward:
            for row in kept:
                if row["step"] > tracker.held:
                    tracker.write(row["step"], _scalars(row))
        self._file = self.path.open("a")

    def write(self, step: int, metrics: dict) -> None:
        """One line: numbers as given (NaN and inf as null), anything else as JSON has it; the trackers
        get the finite numbers."""
        clean = {k: (None if _number(v) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        finite = _scalars(clean)
        if self._tb is not None:
            for key, value in finite.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        for tracker in self._forward:
            if step > tracker.held:
                tracker.write(step, finite)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        """Rows of text and numbers to read, not plot: a table in wandb, trackio and clearml, markdown
        text in TensorBoard; the other trackers have none. Not in metrics.jsonl (what it shows is in
        its own file, such as rollouts.jsonl), so a resume does not send the steps a kill took again."""
        if self._tb is not None:
            self._tb.add_text(name, markdown_table(columns, rows), step)
            self._tb.flush()
        for tracker in self._forward:
            if step > tracker.held:
                tracker.table(step, name, columns, rows)

    def close(self, failed: bool = False) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        for tracker in self._forward:
            tracker.close(failed)

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(failed=exc is not None)


def _writer(
    name: str, run: TrackerRun, run_dir: str | Path, config: dict
) -> WandbWriter | TrackioWriter | AccelerateWriter:
    if name == "wandb":
        return WandbWriter(run, run_dir, config)
    if name == "trackio":
        return TrackioWriter(run, config)
    return AccelerateWriter(name, run, run_dir, config)


def read_metrics(run_dir: str | Path) -> list[dict[str, float]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _scalars(row: dict) -> dict[str, float]:
    """A line's finite numbers, its step aside: what a tracker plots."""
    return {k: v for k, v in row.items() if k != "step" and _number(v) and math.isfinite(v)}


def markdown_table(columns: list[str], rows: list[list]) -> str:
    """A markdown table, as TensorBoard's text tab renders one; a cell's newlines and pipes escaped."""

    def cell(value: object) -> str:
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = [columns, ["---"] * len(columns), *rows]
    return "\n".join("| " + " | ".join(cell(value) for value in line) + " |" for line in lines)
