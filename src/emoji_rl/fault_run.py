"""`make fault-run`: kill -9 a short pipeline at random moments, rerun it, and check its outputs.

Runs the pipeline (configs/cpu/fault.yaml: configs/cpu/experiment.yaml's stages at toy size) once
uninterrupted into OUT/whole, then `--runs` times into OUT/run-NN: starts the runner in its own process
group, SIGKILLs the whole group (the runner and its stage) at a moment drawn uniformly over the
uninterrupted run's duration (seeded), then reruns the same command until it exits 0; with `--rekill P`
each rerun is itself killed with probability P. A run passes when every file of OUT/whole is in OUT/run-NN
with the same content and no other file is: the stages are seeded and run on the CPU in one thread under
one PYTHONHASHSEED, so their data, adapters, metrics, evaluation and report are the same byte for byte.

Left out of the comparison, each because it records when, how long or where, not what:
- `pipeline.log` and `stages/*.done`: the runner's banners, durations and finish times;
- `**/tensorboard/**`: event files named by and holding wall-clock times;
- `**/training_args.bin`: TRL's arguments, pickled: they hold the run's own output_dir, in binary;
- `sft/checkpoint-*`, `grpo/checkpoints`: how a stage resumes, not what it made (a killed run can hold
  a checkpoint an uninterrupted one has deleted);
- in `*metrics.jsonl`, keys of timings (`time/`, `throughput/`, `*runtime`, `*_per_second`, `*_time`:
  an evaluation before any training step also times the model's preparation);
- in `report.md`, the section "## Stage timings";
- in every text file, an adapter's hash (`adapter sha256:...`, eval-retrieval's records' first line): it
  covers training_args.bin too (its run's path); the adapters' other files are compared themselves.
And in every text file the run directory's path is read as `{run_dir}`: each run has its own.

    python -m emoji_rl.fault_run [--runs 20] [--seed 0] [--rekill 0] [--out runs/fault]
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from emoji_rl.io.run_lock import LOCK_FILE

CONFIG = "configs/cpu/fault.yaml"
EXCLUDED = (
    "pipeline.log",
    "stages/*",
    "*/tensorboard/*",
    "*training_args.bin",
    "sft/checkpoint-*",
    "grpo/checkpoints/*",
    LOCK_FILE,  # each holds the PID of the run that last locked its directory
    f"*/{LOCK_FILE}",
)
TIMING_KEY = re.compile(r"^(time/|throughput/)|runtime$|_per_second$|_time$")
TIMINGS_SECTION = re.compile(r"^## Stage timings\n.*?(?=^## |\Z)", re.M | re.S)
ADAPTER_HASH = re.compile(r"adapter sha256:[0-9a-f]+")
BANNER = re.compile(rb"^== pipeline \[\d+/\d+\] (\S+): (?!skipped|done)", re.M)


def kill_times(seed: int, runs: int, duration: float) -> list[float]:
    """When each run is killed, seconds after its start: uniform over the uninterrupted run (`fault_run`
    redoes a run that finished first, killed within its own time)."""
    rng = random.Random(seed)
    return [rng.uniform(0, duration) for _ in range(runs)]


def normalized(path: Path, run_dir: Path) -> bytes:
    """The file's content as compared: its run directory's path replaced, timings dropped."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return data
    text = text.replace(str(run_dir.resolve()), "{run_dir}").replace(str(run_dir), "{run_dir}")
    text = ADAPTER_HASH.sub("adapter sha256:*", text)
    if path.name.endswith("metrics.jsonl"):
        records = [json.loads(line) for line in text.splitlines() if line.strip()]
        kept = [{k: v for k, v in r.items() if not TIMING_KEY.search(k)} for r in records]
        text = "\n".join(json.dumps(r, sort_keys=True) for r in kept)
    elif path.name == "report.md":
        text = TIMINGS_SECTION.sub("", text)
    return text.encode("utf-8")


def compared_files(run_dir: Path) -> set[str]:
    files = {p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file()}
    return {f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in EXCLUDED)}


def differences(whole: Path, run: Path) -> list[str]:
    """The files where `run` differs from `whole`: missing, extra, or another content."""
    expected, got = compared_files(whole), compared_files(run)
    diffs = [f"missing {f}" for f in sorted(expected - got)] + [f"extra {f}" for f in sorted(got - expected)]
    diffs += [
        f"differs {f}"
        for f in sorted(expected & got)
        if normalized(whole / f, whole) != normalized(run / f, run)
    ]
    return diffs


def start(run_dir: Path, config: str, log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "emoji_rl.cli", "pipeline", "--config", config, "--run_dir", str(run_dir)]  # fmt: skip
    with log.open("ab") as out:
        # Its own process group, so that one killpg takes the runner and its stage at once, as a crash
        # of the machine or an OOM kill of the whole job would.
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def stage_at_kill(run_dir: Path) -> str:
    """The stage the runner had started last (a banner without "skipped" or "done")."""
    log = run_dir / "pipeline.log"
    started = BANNER.findall(log.read_bytes()) if log.exists() else []
    return started[-1].decode() if started else "-"


def attempt(run_dir: Path, config: str, log: Path, kill_at: float | None) -> tuple[int | None, str]:
    """One start of the runner: its exit code, or None when it was killed at `kill_at`; and its stage."""
    runner = start(run_dir, config, log)
    try:
        return runner.wait(timeout=kill_at), "-"
    except subprocess.TimeoutExpired:
        stage = stage_at_kill(run_dir)
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()
        return None, stage


def fault_run(index: int, kill_at: float, args: argparse.Namespace, rng: random.Random, duration: float) -> dict:  # fmt: skip
    run_dir = args.out / f"run-{index:02d}"
    shutil.rmtree(run_dir, ignore_errors=True)
    log = args.out / f"run-{index:02d}.console.log"
    log.unlink(missing_ok=True)
    began = time.monotonic()
    code, stage = attempt(run_dir, args.config, log, kill_at)
    while code == 0:
        # It outran its kill (the machine got faster than when the whole run was timed), so it tested
        # nothing: again from scratch, killed within the time it took.
        kill_at = rng.uniform(0, time.monotonic() - began)
        shutil.rmtree(run_dir)
        began = time.monotonic()
        code, stage = attempt(run_dir, args.config, log, kill_at)
    kills, reruns = [stage] if code is None else [], 0
    while code != 0:
        if code is not None:  # failed on its own: a bug a rerun would hide
            break
        reruns += 1
        again = rng.uniform(0, duration) if rng.random() < args.rekill else None
        code, stage = attempt(run_dir, args.config, log, again)
        if code is None:
            kills.append(stage)
    diffs = differences(args.out / "whole", run_dir) if code == 0 else [f"exit code {code}: see {log}"]
    return {"run": index, "kill_s": round(kill_at, 1), "killed_in": kills, "reruns": reruns,
            "same": not diffs, "differences": diffs}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emoji_rl.fault_run", description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rekill", type=float, default=0.0, help="chance that a rerun is killed again")
    parser.add_argument("--config", default=CONFIG)
    parser.add_argument("--out", type=Path, default=Path("runs/fault"))
    args = parser.parse_args(argv)
    # One thread: the 2-core machines run faster so, and every run sums its floats in the same order.
    # One hash seed: PEFT writes adapter_config.json's target_modules from a set, in hash order, and
    # eval-retrieval's records name each adapter by a hash of its files; two whole runs differ there.
    for key, value in {"OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", "HF_HUB_OFFLINE": "1",
                       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():  # fmt: skip
        os.environ.setdefault(key, value)
    args.out.mkdir(parents=True, exist_ok=True)
    whole = args.out / "whole"
    shutil.rmtree(whole, ignore_errors=True)
    print(f"fault-run: the uninterrupted run into {whole}", flush=True)
    began = time.monotonic()
    code, _ = attempt(whole, args.config, args.out / "whole.console.log", None)
    duration = time.monotonic() - began
    if code != 0:
        print(f"fault-run: the uninterrupted run failed ({code}): {args.out / 'whole.console.log'}")
        return 1
    print(f"fault-run: uninterrupted in {duration:.0f} s; {args.runs} runs killed at random moments")
    rng = random.Random(args.seed + 1)  # the reruns' kills, apart from the schedule
    results = []
    header = f"{'run':>3}  {'kill s':>6}  {'killed in':<28}  {'reruns':>6}  same"
    print(header, flush=True)
    for index, kill_at in enumerate(kill_times(args.seed, args.runs, duration), 1):
        result = fault_run(index, kill_at, args, rng, duration)
        results.append(result)
        killed = ", ".join(result["killed_in"]) or "(finished first)"
        same = "yes" if result["same"] else "NO: " + "; ".join(result["differences"][:3])
        print(f"{index:>3}  {kill_at:>6.1f}  {killed:<28}  {result['reruns']:>6}  {same}", flush=True)
        summary = {"config": args.config, "seed": args.seed, "rekill": args.rekill,
                   "uninterrupted_s": round(duration, 1), "runs": results}  # fmt: skip
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    passed = sum(r["same"] for r in results)
    print(f"fault-run: {passed}/{len(results)} the same as the uninterrupted run; {args.out}/summary.json")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
