"""`emoji-rl pipeline --config FILE.yaml`: run a list of stages in order, each once, resumable.

The file names a run directory and the stages, each a command line (docs/DESIGN.md §12):

    run_dir: runs/experiment          # "{run_dir}" in any `run` is replaced by this (or --run_dir)
    stages:
      - name: prompts                 # unique: {run_dir}/stages/prompts.done marks it finished
        run: prompts --source corpus --n 2400 --out {run_dir}/data/prompts.jsonl

A `run` is split with shlex, no shell. If its first word is an emoji-rl stage it runs as
`python -m emoji_rl.cli` of this interpreter, else as it is (`bash launch/train_sft.sh ...`). Each
stage's output goes to the console and to {run_dir}/pipeline.log; a stage that exits 0 gets its
marker, written atomically. A rerun skips the finished stages at the head of the list and runs the
rest: once one stage runs, every stage after it runs again, since its inputs may have changed. A
marker whose command is not the config's is refused rather than trusted. The stage that was
interrupted starts again, so stages resume on their own (`sft` and `grpo` with `--resume true`).

    emoji-rl pipeline --config configs/cpu/experiment.yaml                 # run, or go on after a crash
    emoji-rl pipeline --config configs/cpu/experiment.yaml --dry_run true  # the plan, runs nothing
    emoji-rl pipeline --config configs/cpu/experiment.yaml --from_stage grpo   # grpo and after, again
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from emoji_rl.errors import Stopped, UserError, stop_signal
from emoji_rl.io.jsonl import write_json

RUN_DIR = "{run_dir}"
LOG_FILE = "pipeline.log"
MARKERS_DIR = "stages"
STAGE_KEYS = ("name", "run")
# A stage name is a file name (its marker's).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
PLACEHOLDER = re.compile(r"\{[A-Za-z_]+\}")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass
class Config:
    """Run the stages of a pipeline file in order; a rerun goes on after the last finished stage."""

    stages: list[dict[str, str]] = field(
        default_factory=list,
        metadata={"help": "the stages, each {name, run}: set in the --config file"},
    )
    run_dir: str | None = field(
        default=None,
        metadata={"help": 'run directory: "{run_dir}" in every command, markers and pipeline.log'},
    )
    dry_run: bool = field(
        default=False,
        metadata={"help": "print the numbered commands and which would be skipped; run nothing"},
    )
    from_stage: str | None = field(
        default=None,
        metadata={"help": "run this stage and every one after it again, finished or not; skip those before"},
    )

    def __post_init__(self) -> None:
        if not self.run_dir:
            raise UserError("run_dir is not set: give it in the --config file or as --run_dir DIR")
        if not self.stages:
            raise UserError("no stages: the --config file must hold `stages:`, a list of {name, run}")


@dataclass(frozen=True)
class Stage:
    name: str
    command: list[str]  # as the config says, {run_dir} replaced: what a marker records

    def argv(self, stages: Collection[str]) -> list[str]:
        """What runs: an emoji-rl stage as the CLI of this interpreter, anything else as it is."""
        if self.command[0] in stages:
            return [sys.executable, "-m", "emoji_rl.cli", *self.command]
        return self.command

    def display(self, stages: Collection[str]) -> str:
        prefix = "emoji-rl " if self.command[0] in stages else ""
        return prefix + shlex.join(self.command)


def parse_stages(entries: list[object], run_dir: str) -> list[Stage]:
    """The config's `stages`, checked, with {run_dir} replaced; errors name the key, `stages[i].run`."""
    stages: list[Stage] = []
    for i, entry in enumerate(entries):
        key = f"stages[{i}]"
        if not isinstance(entry, dict):
            raise UserError(f"{key} must be a mapping with keys name and run, got {entry!r}")
        if set(entry) != set(STAGE_KEYS):
            raise UserError(
                f"{key} has the key(s) {', '.join(map(str, entry))}; a stage has exactly: "
                f"{', '.join(STAGE_KEYS)}"
            )
        name, run = entry["name"], entry["run"]
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise UserError(f"{key}.name {name!r} must be letters, digits, '_', '.' or '-' (it names a file)")
        if any(s.name == name for s in stages):
            raise UserError(f"{key}.name {name!r} is used twice: stage names are unique")
        if not isinstance(run, str) or not run.strip():
            raise UserError(f"{key}.run (stage {name}) must be a command line, got {run!r}")
        try:
            words = shlex.split(run)
        except ValueError as err:
            raise UserError(f"{key}.run (stage {name}) does not split as a command line: {err}") from None
        command = [word.replace(RUN_DIR, run_dir) for word in words]
        strays = sorted({m for word in command for m in PLACEHOLDER.findall(word)})
        if strays:
            raise UserError(f"{key}.run (stage {name}) holds {', '.join(strays)}: only {RUN_DIR} is replaced")
        stages.append(Stage(name, command))
    return stages


# --- what a rerun does -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    stage: Stage
    action: str  # "run" | "skip" (finished) | "before" (ahead of --from_stage)
    why: str


def marker_path(run_dir: Path, name: str) -> Path:
    return run_dir / MARKERS_DIR / f"{name}.done"


def read_marker(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        # Markers are written atomically: a bad one was edited by hand.
        raise UserError(f"{path} is not a stage marker ({err}): delete it to run the stage again") from None
    if not isinstance(marker, dict) or not isinstance(marker.get("command"), list):
        raise UserError(f"{path} is not a stage marker (no command list): delete it to run the stage again")
    return marker


def plan(stages: list[Stage], run_dir: Path, from_stage: str | None) -> list[Step]:
    """Skip the finished stages at the head of the list (or those before `from_stage`); run the rest."""
    names = [s.name for s in stages]
    if from_stage is not None and from_stage not in names:
        raise UserError(f"--from_stage {from_stage}: no such stage; the stages are {', '.join(names)}")
    steps: list[Step] = []
    running = False
    for stage in stages:
        if from_stage is not None and not running:
            if stage.name != from_stage:
                steps.append(Step(stage, "before", f"before --from_stage {from_stage}"))
                continue
            running = True
            steps.append(Step(stage, "run", "--from_stage"))
            continue
        if running:
            steps.append(Step(stage, "run", "an earlier stage runs"))
            continue
        path = marker_path(run_dir, stage.name)
        marker = read_marker(path)
        if marker is None:
            running = True
            steps.append(Step(stage, "run", "not finished"))
        elif marker["command"] != stage.command:
            raise UserError(
                f"stage {stage.name} finished with another command than the config's:\n"
                f"  marker ({path}): {shlex.join(map(str, marker['command']))}\n"
                f"  config:  {shlex.join(stage.command)}\n"
                f"its outputs are not the config's. Delete the marker (and the stage's outputs) to run it "
                f"again, or delete the run directory {run_dir} to start over"
            )
        else:
            steps.append(Step(stage, "skip", f"finished {marker.get('finished', '?')}"))
    return steps


# --- running a stage ---------------------------------------------------------------------------------


def _stop(signum: int, frame: object) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While the stages run, `kill PID`, `timeout` or a scheduler's stop is handled as Ctrl-C is: the
    stage stopped, the log told, the exit 128 + 15. The handler before it comes back after."""
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the runner dies, even by SIGKILL, so no training outlives
    it (SIGTERM, not SIGKILL: a launch script stops its servers, accelerate its ranks). Linux only."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def run_child(argv: list[str], log: BinaryIO, preexec: Callable[[], None] | None = die_with_parent) -> int:
    """Run `argv`, its stdout and stderr copied as they come to the console and to `log`; its exit code
    (negative: killed by that signal). Chunks, not lines: progress bars redraw with carriage returns."""
    parent = os.getpid()

    def preexec_fn() -> None:
        if preexec is not None:
            preexec()
        if os.getppid() != parent:  # the runner died before prctl took effect
            os._exit(1)

    try:
        child = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=preexec_fn
        )
    except FileNotFoundError:
        raise UserError(f"command not found: {argv[0]}") from None
    assert child.stdout is not None
    out = sys.stdout.buffer
    try:
        while chunk := os.read(child.stdout.fileno(), 1 << 16):
            out.write(chunk)
            out.flush()
            log.write(chunk)
            log.flush()
        return child.wait()
    finally:
        if child.poll() is None:  # the runner is leaving (Ctrl-C, an error): take the stage with it
            child.terminate()
            child.wait()
        child.stdout.close()


def write_marker(run_dir: Path, stage: Stage, seconds: float) -> None:
    finished = datetime.now(UTC).isoformat(timespec="seconds")
    record = {
        "name": stage.name,
        "command": stage.command,
        "seconds": round(seconds, 1),
        "finished": finished,
    }
    write_json(marker_path(run_dir, stage.name), record)


def main(cfg: Config) -> None:
    from emoji_rl.cli import STAGES

    run_dir = Path(cfg.run_dir)  # type: ignore[arg-type]  # __post_init__ checked it
    stages = parse_stages(cfg.stages, str(run_dir))
    steps = plan(stages, run_dir, cfg.from_stage)
    width = len(str(len(steps)))
    if cfg.dry_run:
        for i, step in enumerate(steps, 1):
            label = "run " if step.action == "run" else "skip"
            print(f"{i:>{width}}. [{label}] {step.stage.name} ({step.why}): {step.stage.display(STAGES)}")
        return
    # From the first stage that runs, every later marker is stale: remove them before anything runs,
    # so that a crash in the middle cannot leave one behind to be trusted.
    for step in steps:
        if step.action == "run":
            marker_path(run_dir, step.stage.name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / LOG_FILE
    with sigterm_as_interrupt(), log_path.open("ab") as log:
        for i, step in enumerate(steps, 1):
            stage = step.stage
            header = f"== pipeline [{i}/{len(steps)}] {stage.name}"
            if step.action != "run":
                # In the log too: a rerun reads there as one, not as a stage that started twice.
                skipped = f"{header}: skipped ({step.why})\n"
                print(skipped, end="", flush=True)
                log.write(skipped.encode())
                continue
            now = datetime.now(UTC).isoformat(timespec="seconds")
            banner = f"{header}: {stage.display(STAGES)}  ({now})\n"
            print(banner, end="", flush=True)
            log.write(banner.encode())
            log.flush()
            start = time.monotonic()
            try:
                code = run_child(stage.argv(STAGES), log)
            except KeyboardInterrupt as stop:
                name = stop_signal(stop).name
                log.write(f"{header}: stopped by {name} after {time.monotonic() - start:.0f} s\n".encode())
                raise
            seconds = time.monotonic() - start
            if code != 0:
                how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
                log.write(f"{header}: {how} after {seconds:.0f} s\n".encode())
                raise UserError(
                    f"stage {stage.name} {how} after {seconds:.0f} s; its output is in {log_path}. "
                    f"Earlier stages stay finished: rerun the same command to go on from {stage.name}"
                )
            write_marker(run_dir, stage, seconds)
            log.write(f"{header}: done in {seconds:.0f} s\n".encode())
    print(f"pipeline: {len(steps)} stages finished; log in {log_path}, markers in {run_dir / MARKERS_DIR}")
