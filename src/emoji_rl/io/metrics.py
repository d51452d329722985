"""Run metrics: one JSON line per step in `metrics.jsonl` and the same scalars in the trackers that
`report_to` names (TensorBoard, wandb, trackio: `io/trackers.py`; accelerate's, such as mlflow:
`io/accelerate_trackers.py`), at the same step numbers.

Keys are slash-namespaced and stable (`reward/mean`, `optim/kl`, `time/rollout_s`), so runs compare
on a dashboard and in `jq`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

from emoji_rl.config import to_dict
from emoji_rl.io.accelerate_trackers import AccelerateWriter
from emoji_rl.io.jsonl import drop_steps_after, keep_first_lines, rewrite_records
from emoji_rl.io.trackers import (
    TrackerConfig,
    TrackerRun,
    TrackioWriter,
    WandbWriter,
    forget_mlflow_run,
    resolve,
    tracker_run,
)


class MetricsWriter:
    """Appends `{"step": n, **metrics}` lines; a resumed run keeps the lines of earlier steps only.

    Every tracker ends with each metric of each step once, at metrics.jsonl's step numbers, whatever
    killed the run before and wherever. TensorBoard forgets the steps from the checkpoint's on
    (`purge_step`) and is sent again the lines kept there: a line of that step may be redone (sft's
    final evaluation after its last checkpoint), or kept yet never flushed to TensorBoard by the
    killed run. wandb's, trackio's and mlflow's histories only
    go forward, and a kill -9 can drop what they held in memory: each says what it holds (`Held`: the
    last step, and what of it), and what metrics.jsonl keeps beyond that is sent again before the run
    goes on; what a tracker holds past the checkpoint keeps the value the dead run gave it, and is not
    sent twice. accelerate's other trackers start a new run, which gets every line.

    Metric names are checked as they come: none may be the folder of another (`eval/reward` beside
    `eval/reward/contrast`), which mlflow's file store cannot keep (a metric is a file there)."""

    def __init__(
        self,
        run_dir: str | Path,
        resume_from_step: int = 0,
        trackers: TrackerConfig | None = None,
        keep_lines: int | None = None,
        rename: Callable[[dict], dict] | None = None,
    ) -> None:
        """`keep_lines`: a resumed run keeps this many first lines (a Trainer's log history), not the
        lines up to its checkpoint's step. `rename`: a kept line under the names logged now (a run from
        before a rename); one renamed starts a new mlflow run, as the old one may hold an old name
        that is a folder of a new one."""
        trackers = trackers or TrackerConfig()
        names = resolve(trackers.report_to)
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Steps after the checkpoint were logged by a run that then died: they are redone, so drop them.
        if keep_lines is None:
            drop_steps_after(self.path, resume_from_step)
        else:
            keep_first_lines(self.path, keep_lines)
        if rename is not None and rewrite_records(self.path, rename):
            forget_mlflow_run(run_dir)
        kept = read_metrics(run_dir) if self.path.is_file() else []
        self._names = {key for row in kept for key in row if key != "step"}
        self._tb = None
        if "tensorboard" in names:
            from torch.utils.tensorboard import SummaryWriter

            # TensorBoard forgets whole steps, from the checkpoint's on, and is sent the lines kept
            # there again: one of them may be redone (sft's final evaluation after its last
            # checkpoint), and the last kept line may never have reached TensorBoard (a line goes to
            # metrics.jsonl first, and the kill can fall between the two).
            self._tb = SummaryWriter(str(Path(run_dir) / "tensorboard"), purge_step=resume_from_step)
            for row in kept:
                if row["step"] == resume_from_step:
                    self._scalars_to_tensorboard(row["step"], _scalars(row))
        forwarded = [name for name in names if name != "tensorboard"]
        self._forward: list[WandbWriter | TrackioWriter | AccelerateWriter] = []
        if forwarded:
            run = tracker_run(run_dir, trackers)
            config = to_dict(trackers)
            self._forward = [_writer(name, run, run_dir, config) for name in forwarded]
        for tracker in self._forward:
            for row in kept:
                tracker.write(row["step"], _scalars(row))
        self._file = self.path.open("a")

    def write(self, step: int, metrics: dict) -> None:
        """One line: numbers as given (NaN and inf as null), anything else as JSON has it; the trackers
        get the finite numbers."""
        clean = {k: (None if _number(v) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._check_names(clean)
        self._file.write(json.dumps({"step": step, **clean}) + "\n")
        self._file.flush()
        finite = _scalars(clean)
        if self._tb is not None:
            self._scalars_to_tensorboard(step, finite)
        for tracker in self._forward:
            tracker.write(step, finite)

    def _scalars_to_tensorboard(self, step: int, scalars: dict[str, float]) -> None:
        assert self._tb is not None
        for key, value in scalars.items():
            self._tb.add_scalar(key, value, step)
        self._tb.flush()

    def _check_names(self, metrics: dict) -> None:
        new = metrics.keys() - self._names
        if not new:
            return
        clashes = folder_clashes(self._names | new)
        if clashes:
            folder, name = clashes[0]
            raise ValueError(
                f"metric {folder!r} is also the folder of {name!r}: mlflow's file store keeps a metric "
                f"as a file, so it cannot hold both; name it {folder}/mean, as reward/mean is beside "
                "reward/contrast/mean"
            )
        self._names |= new

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        """Rows of text and numbers to read, not plot: a table in wandb, trackio and clearml, markdown
        text in TensorBoard; the other trackers have none. Not in metrics.jsonl (what it shows is in
        its own file, such as rollouts.jsonl), so a resume does not send the steps a kill took again."""
        if self._tb is not None:
            self._tb.add_text(name, markdown_table(columns, rows), step)
            self._tb.flush()
        for tracker in self._forward:
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


def folder_clashes(names: Iterable[str]) -> list[tuple[str, str]]:
    """(folder, name) for each name of `names` that another of them has as a folder (`eval/reward`
    of `eval/reward/contrast`), sorted: what mlflow's file store cannot keep, a metric being a file
    there at its name's path."""
    names = set(names)
    return sorted(
        (folder, name)
        for name in names
        for folder in ("/".join(name.split("/")[:depth]) for depth in range(1, name.count("/") + 1))
        if folder in names
    )


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
