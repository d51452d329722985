"""Experiment trackers beside metrics.jsonl, named and read as TRL's `report_to` is: `tensorboard`,
`wandb`, `trackio`, accelerate's other trackers (`mlflow`, `comet_ml`, `clearml`, `dvclive`, `aim`,
`swanlab`: io/accelerate_trackers.py), `all` (those installed) or `none`.

A run directory keeps its tracker run in `trackers.json` (wandb's run id, the project and the run's
name, which trackio resumes by, and mlflow's run id once it has one), written when the run first
starts: a resumed run continues the same wandb, trackio and mlflow run whatever `project` and
`run_name` say then. No credential is ever written there: each tracker reads its own from its own
environment variables and files.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, get_args

from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import write_json
from emoji_rl.io.wandb_file import offline_last_step

# The last six are made by accelerate's own tracker classes, under the names TRL and accelerate share.
ReportTo = Literal[
    "tensorboard",
    "wandb",
    "trackio",
    "mlflow",
    "comet_ml",
    "clearml",
    "dvclive",
    "aim",
    "swanlab",
    "all",
    "none",
]
TRACKERS = tuple(name for name in get_args(ReportTo) if name not in ("all", "none"))
EXTRAS = "pip install -e '.[trackers]'"
# The trackers the extras leave out; aim below 4, as accelerate's AimTracker requires.
INSTALL = {
    "comet_ml": "pip install comet-ml",
    "clearml": "pip install clearml",
    "dvclive": "pip install dvclive",
    "aim": "pip install 'aim<4'",
    "swanlab": "pip install swanlab",
}
STATE_FILE = "trackers.json"
V = TypeVar("V")


@dataclass
class TrackerConfig:
    """Where a training stage's metrics go besides metrics.jsonl (TRL's field names)."""

    report_to: list[ReportTo] = field(
        default_factory=lambda: ["tensorboard"],
        metadata={
            "help": "trackers that get the metrics besides metrics.jsonl, as TRL's report_to: tensorboard, "
            "wandb, trackio, mlflow, comet_ml, clearml, dvclive, aim, swanlab (the last six through "
            f"accelerate's trackers), all (those installed; mlflow once it has a store) or none; wandb, trackio and mlflow need `{EXTRAS}`"
        },
    )
    project: str = field(
        default="emoji-rl",
        metadata={"help": "the project (mlflow: the experiment) a new run is logged under in the trackers"},
    )
    run_name: str | None = field(
        default=None,
        metadata={"help": "the run's name in the trackers; none: the output directory's name and an id"},
    )


def check_trackers(trackers: TrackerConfig) -> None:
    """A training stage's trackers checked where its config is, before any work (its __post_init__):
    each named one imports (`resolve`), the names a run is logged under are ones they take, an online
    wandb has credentials, and mlflow a store it can write."""
    if not trackers.project.strip():
        raise UserError("project is empty: the trackers' project a run is logged under needs a name")
    names = resolve(trackers.report_to)
    if "wandb" in names:
        _check_wandb_names(trackers.project, trackers.run_name)
        _check_wandb_login()
    if "mlflow" in names:
        _check_mlflow_store()


def _check_wandb_names(project: str, run_name: str | None) -> None:
    """The project name as wandb itself checks it (its Settings), here rather than after the model has
    loaded; trackers.json keeps a run's names, so a name wandb refuses must never reach it."""
    import wandb
    from wandb.errors import UsageError

    try:
        wandb.Settings(project=project, run_name=run_name)
    except (UsageError, ValueError) as err:
        raise UserError(f"project={project!r}: wandb refuses it ({err}); choose another --project") from None


def _check_wandb_login() -> None:
    """An online wandb run's credentials, looked for where wandb.init looks (WANDB_API_KEY, an identity
    token file, ~/.netrc, its settings) and not sent anywhere: without them wandb.init asks at a
    prompt, or stops without a terminal, after the model has loaded and the run directory is written."""
    from wandb.errors import AuthenticationError
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib import wbauth

    try:
        settings = wandb_setup.singleton().settings  # what wandb.init reads, from the environment
    except ValueError as err:  # pydantic's: a WANDB_ variable of a value wandb refuses
        raise UserError(f"report_to wandb: wandb refuses its settings: {str(err).splitlines()[0]}") from None
    if settings.mode in ("offline", "dryrun", "disabled"):
        return
    try:
        auth = wbauth.authenticate_session(
            host=settings.base_url, source="emoji-rl", prompt=False, update_session=False
        )
    except AuthenticationError as err:
        raise UserError(f"report_to wandb: {err}") from None
    if auth is None:
        raise UserError(
            f"report_to wandb: wandb logs online (WANDB_MODE={settings.mode}) and finds no API key for "
            f"{settings.base_url}: run `wandb login` or set WANDB_API_KEY, or set WANDB_MODE=offline to "
            "keep the run in the run directory and `wandb sync` it later"
        )


def _mlflow_store_problem() -> str | None:
    """Why mlflow cannot keep runs at its tracking URI (None: it can), its stores built as its client
    builds them: mlflow-skinny has no database store for the default URI (sqlite), and mlflow refuses
    a folder unless allowed; found here, not after the model has loaded. A tracking server is not
    contacted."""
    import mlflow
    from mlflow.exceptions import MlflowException

    try:
        mlflow.MlflowClient()
    except (MlflowException, ImportError, OSError) as err:  # OSError: a folder it cannot make
        return (
            f"mlflow cannot keep runs at its tracking URI {mlflow.get_tracking_uri()} ({err}); set "
            "MLFLOW_TRACKING_URI to your tracking server (http://HOST:PORT), or install mlflow itself "
            "(`pip install mlflow`: mlflow-skinny has no database store)"
        )
    return None


def _check_mlflow_store() -> None:
    problem = _mlflow_store_problem()
    if problem is not None:
        raise UserError(f"report_to mlflow: {problem}")


def _usable(name: str) -> bool:
    """Whether `all` takes the tracker: installed, and for mlflow a store it can write (mlflow-skinny,
    which the trackers extra installs, has none until MLFLOW_TRACKING_URI names one)."""
    if name == "tensorboard":
        return True
    if importlib.util.find_spec(name) is None:
        return False
    return name != "mlflow" or _mlflow_store_problem() is None


def _require(name: str) -> None:
    try:
        importlib.import_module(name)
    except ImportError as err:
        raise UserError(
            f"report_to {name}: the {name} package does not import ({err}); install it with "
            f"{INSTALL.get(name, EXTRAS)}"
        ) from err


def resolve(report_to: Sequence[str]) -> tuple[str, ...]:
    """The trackers `report_to` names, checked before any work: `none` alone means none, `all` means
    those installed and usable (tensorboard always; mlflow with a store it can write), and each named
    one must import."""
    names = tuple(dict.fromkeys(report_to))
    if not names:
        raise UserError(f"report_to is empty: name the trackers ({', '.join(TRACKERS)}, all), or none")
    if "none" in names:
        if len(names) > 1:
            raise UserError(f"report_to: none means no tracker, so it stands alone; got {' '.join(names)}")
        return ()
    if "all" in names:
        return tuple(name for name in TRACKERS if _usable(name))
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
    """One run in the trackers: wandb's id, the project, the name (trackio resumes by name) and
    mlflow's run id, which mlflow itself gives a new run."""

    id: str
    project: str
    name: str
    mlflow_run_id: str | None = None


def tracker_run(run_dir: str | Path, cfg: TrackerConfig) -> TrackerRun:
    """This run directory's tracker run: the one its `trackers.json` keeps, or a new one written there."""
    path = Path(run_dir) / STATE_FILE
    if path.is_file():
        try:
            return TrackerRun(**json.loads(path.read_text()))
        except (ValueError, TypeError) as err:
            raise UserError(
                f"{path} is not a tracker run ({err}): restore it, or delete it to start new tracker runs"
            ) from err
    # wandb's own ids are 8 characters of [a-z0-9].
    run_id = secrets.token_hex(4)
    run = TrackerRun(run_id, cfg.project, cfg.run_name or f"{Path(run_dir).resolve().name}-{run_id}")
    _keep(path, run)
    return run


def keep_mlflow_run(run_dir: str | Path, run: TrackerRun, mlflow_run_id: str) -> TrackerRun:
    """`run` with the mlflow run just started for it, kept in trackers.json before anything is
    logged there, so a resume continues that mlflow run."""
    run = dataclasses.replace(run, mlflow_run_id=mlflow_run_id)
    _keep(Path(run_dir) / STATE_FILE, run)
    return run


def _keep(path: Path, run: TrackerRun) -> None:
    # A run without mlflow keeps no mlflow field, as trackers.json was before mlflow was a tracker.
    write_json(path, {key: value for key, value in dataclasses.asdict(run).items() if value is not None})


def forget_mlflow_run(run_dir: str | Path) -> None:
    """Start a new mlflow run at the next start, the one trackers.json keeps left as it is: for a run
    whose metric names changed (a file store cannot keep a name beside a folder of the same name)."""
    path = Path(run_dir) / STATE_FILE
    if path.is_file():
        run = tracker_run(run_dir, TrackerConfig())
        if run.mlflow_run_id is not None:
            _keep(path, dataclasses.replace(run, mlflow_run_id=None))


@dataclass
class Held:
    """What a tracker holds of its run, so that it is sent only what it lacks: everything up to `step`,
    and at `step` the names in `names` (None: all of that step's). Counted per name, not per step: sft
    logs several lines at one step (the training line, the evaluation, the closing summary), and a kill
    between two of them leaves the first in a tracker and not the others."""

    step: int = -1
    names: set[str] | None = field(default_factory=set)

    def take(self, step: int, values: Mapping[str, V]) -> dict[str, V]:
        """What of `values`, logged at `step`, the tracker lacks, counted as held from now: all of a
        later step's, at `step` the names it does not hold yet, nothing of an earlier step."""
        if step > self.step:
            self.step, self.names = step, set()
        if step < self.step or self.names is None:
            return {}
        lacking = {name: value for name, value in values.items() if name not in self.names}
        self.names.update(lacking)
        return lacking


def wandb_dir(run_dir: str | Path) -> str:
    """Where wandb keeps its files (offline runs included): $WANDB_DIR, else the run directory."""
    return os.environ.get("WANDB_DIR") or str(run_dir)


class WandbWriter:
    """Metrics to wandb at our step numbers, in the run directory's wandb run. `held`: what wandb
    already holds of it (an SFT run logs a step 0), whole steps: wandb commits a step's row when the
    next step starts or the run finishes, so a killed process's last step is all there or not at all."""

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
        if self._run.offline:
            # wandb holds in memory what it has not written yet, so a kill -9 drops the tail of the
            # dead process's file: read what every earlier file of this run kept.
            last = offline_last_step(wandb_dir(run_dir), run.id, exclude=Path(self._run.dir).parent)
        else:
            # The server's: the step a resumed run goes on from is the one after its history's last.
            last = self._run.starting_step - 1
        self.held = Held(last, None)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        lacking = self.held.take(step, metrics)
        if lacking:
            self._run.log(lacking, step=step)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        import wandb

        if self.held.take(step, {name: rows}):
            self._run.log({name: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self, failed: bool = False) -> None:
        self._run.finish(exit_code=int(failed))


class TrackioWriter:
    """Metrics to trackio (its local store, $TRACKIO_DIR, unless a Space is set up) at our step numbers.
    `held`: what its store holds of the run: each log is a row of its own, so a kill between two lines
    of one step can leave the first there without the second."""

    def __init__(self, run: TrackerRun, config: dict) -> None:
        import trackio
        from trackio.sqlite_storage import SQLiteStorage

        self._trackio = trackio
        self._run = trackio.init(project=run.project, name=run.name, resume="allow", config=config)
        last = SQLiteStorage.get_last_step(run.project, run=run.name)
        self.held = Held()
        if last is not None:
            rows = SQLiteStorage.get_logs(run.project, run.name)
            names = {key for row in rows if row["step"] == last for key in row} - {"step", "timestamp"}
            self.held = Held(last, names)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        lacking = self.held.take(step, metrics)
        if lacking:
            self._run.log(lacking, step=step)

    def table(self, step: int, name: str, columns: list[str], rows: list[list]) -> None:
        import pandas

        if not self.held.take(step, {name: rows}):
            return
        # trackio's Table ignores `columns` beside `data`: a DataFrame carries the names.
        frame = pandas.DataFrame(rows, columns=columns)
        self._run.log({name: self._trackio.Table(dataframe=frame)}, step=step)

    def close(self, failed: bool = False) -> None:
        self._trackio.finish()
