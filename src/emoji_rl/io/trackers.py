"""Experiment trackers beside metrics.jsonl, named and read as TRL's `report_to` is: `tensorboard`,
`wandb`, `trackio`, `all` (those installed) or `none`.

A run directory keeps its tracker run in `trackers.json` (wandb's run id, the project and the run's
name, which trackio resumes by), written when the run first starts: a resumed run continues the same
wandb and trackio run whatever `project` and `run_name` say then. No credential is ever written there:
wandb and trackio read theirs from their own environment variables and files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import os
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import write_json

TRACKERS = ("tensorboard", "wandb", "trackio")
ReportTo = Literal["tensorboard", "wandb", "trackio", "all", "none"]
EXTRAS = "pip install -e '.[trackers]'"
STATE_FILE = "trackers.json"


@dataclass
class TrackerConfig:
    """Where a training stage's metrics go besides metrics.jsonl (TRL's field names)."""

    report_to: list[ReportTo] = field(
        default_factory=lambda: ["tensorboard"],
        metadata={
            "help": "trackers that get the metrics besides metrics.jsonl, as TRL's report_to: tensorboard, "
            f"wandb, trackio, all (those installed) or none; wandb and trackio need `{EXTRAS}`"
        },
    )
    project: str = field(
        default="emoji-rl", metadata={"help": "the wandb and trackio project a new run is logged under"}
    )
    run_name: str | None = field(
        default=None,
        metadata={"help": "the run's name in wandb and trackio; none: the output directory's name and an id"},
    )


def check_trackers(trackers: TrackerConfig) -> None:
    """A training stage's trackers checked where its config is, before any work (its __post_init__):
    each named one imports (`resolve`), and the names a run is logged under are ones they take."""
    if not trackers.project.strip():
        raise UserError("project is empty: the wandb and trackio project a run is logged under needs a name")
    if "wandb" in resolve(trackers.report_to):
        _check_wandb_names(trackers.project, trackers.run_name)


def _check_wandb_names(project: str, run_name: str | None) -> None:
    """The project name as wandb itself checks it (its Settings), here rather than after the model has
    loaded; trackers.json keeps a run's names, so a name wandb refuses must never reach it."""
    import wandb
    from wandb.errors import UsageError

    try:
        wandb.Settings(project=project, run_name=run_name)
    except (UsageError, ValueError) as err:
        raise UserError(f"project={project!r}: wandb refuses it ({err}); choose another --project") from None


def _require(name: str) -> None:
    try:
        importlib.import_module(name)
    except ImportError as err:
        raise UserError(
            f"report_to {name}: the {name} package does not import ({err}); install it with {EXTRAS}"
        ) from err


def resolve(report_to: Sequence[str]) -> tuple[str, ...]:
    """The trackers `report_to` names, checked before any work: `none` alone means none, `all` means
    those installed (tensorboard always), and each named one must import."""
    names = tuple(dict.fromkeys(report_to))
    if not names:
        raise UserError("report_to is empty: name the trackers (tensorboard, wandb, trackio, all), or none")
    if "none" in names:
        if len(names) > 1:
            raise UserError(f"report_to: none means no tracker, so it stands alone; got {' '.join(names)}")
        return ()
    if "all" in names:
        return tuple(name for name in TRACKERS if name == "tensorboard" or importlib.util.find_spec(name))
    unknown = [name for name in names if name not in TRACKERS]
    if unknown:
        raise UserError(
            f"report_to: unknown {', '.join(unknown)}; choose from {', '.join(TRACKERS)}, all, none"
        )
    for name in names:
        if name != "tensorboard":
            _require(name)
    return names


@dataclass(frozen=True)
class TrackerRun:
    """One run in wandb and trackio: wandb's id, the project, the name (trackio resumes by name)."""

    id: str
    project: str
    name: str


def tracker_run(run_dir: str | Path, cfg: TrackerConfig) -> TrackerRun:
    """This run directory's tracker run: the one its `trackers.json` keeps, or a new one written there."""
    path = Path(run_dir) / STATE_FILE
    if path.is_file():
        try:
            return TrackerRun(**json.loads(path.read_text()))
        except (ValueError, TypeError) as err:
            raise UserError(
                f"{path} is not a tracker run ({err}): restore it, or delete it to start a new wandb/trackio run"
            ) from err
    # wandb's own ids are 8 characters of [a-z0-9].
    run_id = secrets.token_hex(4)
    run = TrackerRun(run_id, cfg.project, cfg.run_name or f"{Path(run_dir).resolve().name}-{run_id}")
    write_json(path, dataclasses.asdict(run))
    return run


def wandb_dir(run_dir: str | Path) -> str:
    """Where wandb keeps its files (offline runs included): $WANDB_DIR, else the run directory."""
    return os.environ.get("WANDB_DIR") or str(run_dir)


class WandbWriter:
    """Metrics to wandb at our step numbers, in the run directory's wandb run."""

    def __init__(self, run: TrackerRun, run_dir: str | Path, config: dict) -> None:
        import wandb

        self._run = wandb.init(
            project=run.project,
            name=run.name,
            id=run.id,
            resume="allow",
            dir=wandb_dir(run_dir),
            config=config,
        )

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self, failed: bool = False) -> None:
        self._run.finish(exit_code=int(failed))


class TrackioWriter:
    """Metrics to trackio (its local store, $TRACKIO_DIR, unless a Space is set up) at our step numbers."""

    def __init__(self, run: TrackerRun, config: dict) -> None:
        import trackio

        self._trackio = trackio
        self._run = trackio.init(project=run.project, name=run.name, resume="allow", config=config)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self._run.log(metrics, step=step)

    def close(self, failed: bool = False) -> None:
        self._trackio.finish()


@contextlib.contextmanager
def trl_tracking(
    names: Sequence[str], run: TrackerRun | None, run_dir: str | Path, config: dict
) -> Iterator[None]:
    """The trackers of a block in which transformers' callbacks report (`sft`). Its wandb callback logs
    into the run it finds started, so the run directory's is started here, by id, in the run directory
    (wandb reads WANDB_DIR once per process: set for the callback, a second stage of one process would
    write into the first one's directory); its trackio callback resumes the run the
    training arguments name. Neither finishes its run after the Trainer's last evaluation: done here,
    so that the next run in this process starts its own."""
    wandb_run = WandbWriter(run, run_dir, config) if run is not None and "wandb" in names else None
    failed = True
    try:
        yield
        failed = False
    finally:
        if wandb_run is not None:
            wandb_run.close(failed)
        if "trackio" in names:
            import trackio

            if trackio.context_vars.current_run.get() is not None:
                trackio.finish()
