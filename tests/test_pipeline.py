"""`emoji-rl pipeline`: stages run in order once, a rerun goes on after the last finished one, a changed
command is refused, a failure stops the run and names the stage; tiny `python -c` stand-ins as stages."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from emoji_rl import cli
from emoji_rl.errors import UserError
from emoji_rl.pipeline import Stage

PY = shlex.quote(sys.executable)
ROOT = Path(__file__).resolve().parents[1]


def append(word: str) -> str:
    """A stage that appends `word` to {run_dir}/ran.txt: the file says which stages ran, in order."""
    code = f"import sys; open(sys.argv[1], 'a').write('{word}\\n')"
    return f"{PY} -c {shlex.quote(code)} {{run_dir}}/ran.txt"


def write_config(path: Path, stages: list[tuple[str, str]], run_dir: Path | None) -> Path:
    config = {"stages": [{"name": name, "run": run} for name, run in stages]}
    if run_dir is not None:
        config["run_dir"] = str(run_dir)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def pipeline(config: Path, *args: str) -> int:
    return cli.main(["pipeline", "--config", str(config), *args])


def ran(run_dir: Path) -> list[str]:
    path = run_dir / "ran.txt"
    return path.read_text().split() if path.exists() else []


@pytest.fixture
def three(tmp_path):
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "p.yaml", [(w, append(w)) for w in ("a", "b", "c")], run_dir)
    return config, run_dir


def test_stages_run_in_order_with_run_dir_replaced_and_leave_markers_and_a_log(three, capfd):
    config, run_dir = three
    handler = signal.getsignal(signal.SIGTERM)
    assert pipeline(config) == 0
    assert signal.getsignal(signal.SIGTERM) is handler  # SIGTERM is the stages' only while they run
    assert ran(run_dir) == ["a", "b", "c"]  # the file is under run_dir: {run_dir} was replaced
    marker = json.loads((run_dir / "stages" / "b.done").read_text())
    assert set(marker) == {"name", "command", "seconds", "finished"} and marker["name"] == "b"
    assert marker["command"][-1] == f"{run_dir}/ran.txt" and marker["command"][0] == sys.executable
    log = (run_dir / "pipeline.log").read_text()
    assert [line.split(":")[0] for line in log.splitlines() if line.endswith(" s")] == [
        f"== pipeline [{i}/3] {name}" for i, name in enumerate("abc", 1)
    ]
    assert "pipeline: 3 stages finished" in capfd.readouterr().out


def test_a_rerun_skips_finished_stages_and_runs_nothing_again(three, capfd):
    config, run_dir = three
    assert pipeline(config) == 0 and pipeline(config) == 0
    assert ran(run_dir) == ["a", "b", "c"]
    out = capfd.readouterr().out
    assert "[2/3] b: skipped (finished " in out


def test_run_dir_on_the_command_line_wins(three, tmp_path):
    config, run_dir = three
    other = tmp_path / "other"
    assert pipeline(config, "--run_dir", str(other)) == 0
    assert ran(other) == ["a", "b", "c"] and not run_dir.exists()


def test_the_output_of_a_stage_streams_to_the_console_and_the_log(tmp_path, capfd):
    code = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"
    config = write_config(tmp_path / "p.yaml", [("talk", f"{PY} -c {shlex.quote(code)}")], tmp_path / "r")
    assert pipeline(config) == 0
    out = capfd.readouterr().out
    log = (tmp_path / "r" / "pipeline.log").read_text()
    for text in ("to stdout", "to stderr"):
        assert text in out and text in log


def test_a_failing_stage_stops_the_pipeline_names_itself_and_keeps_earlier_markers(tmp_path, capfd):
    run_dir = tmp_path / "run"
    fail = f"{PY} -c 'import sys; sys.exit(3)'"
    stages = [("a", append("a")), ("b", fail), ("c", append("c"))]
    config = write_config(tmp_path / "p.yaml", stages, run_dir)
    assert pipeline(config) == 2
    err = capfd.readouterr().err
    assert "stage b exited with code 3" in err and str(run_dir / "pipeline.log") in err
    assert ran(run_dir) == ["a"]
    assert sorted(p.name for p in (run_dir / "stages").iterdir()) == ["a.done"]
    assert "[2/3] b: exited with code 3" in (run_dir / "pipeline.log").read_text()
    # Fixed, the rerun goes on from b: a is not run again.
    write_config(config, [("a", append("a")), ("b", append("b")), ("c", append("c"))], run_dir)
    assert pipeline(config) == 0 and ran(run_dir) == ["a", "b", "c"]


def test_a_changed_command_is_refused_naming_the_stage_and_both_commands(three, capfd):
    config, run_dir = three
    assert pipeline(config) == 0
    write_config(config, [("a", append("a")), ("b", append("B")), ("c", append("c"))], run_dir)
    capfd.readouterr()
    assert pipeline(config) == 2
    err = capfd.readouterr().err
    assert "stage b finished with another command than the config's" in err
    assert "print" not in err and "'b\\n'" in err and "'B\\n'" in err  # the old command and the new
    assert str(run_dir / "stages" / "b.done") in err and "Delete the marker" in err
    assert "delete the run directory" in err
    assert ran(run_dir) == ["a", "b", "c"]  # nothing ran
    (run_dir / "stages" / "b.done").unlink()  # as the message says
    assert pipeline(config) == 0 and ran(run_dir) == ["a", "b", "c", "B", "c"]


def test_once_a_stage_runs_every_later_stage_runs_again(three):
    config, run_dir = three
    assert pipeline(config) == 0
    (run_dir / "stages" / "b.done").unlink()
    assert pipeline(config) == 0 and ran(run_dir) == ["a", "b", "c", "b", "c"]


def test_from_stage_runs_that_stage_and_the_rest_and_skips_those_before(three, capfd):
    config, run_dir = three
    assert pipeline(config, "--from_stage", "b") == 0
    assert ran(run_dir) == ["b", "c"] and not (run_dir / "stages" / "a.done").exists()
    assert pipeline(config, "--from_stage", "c") == 0 and ran(run_dir) == ["b", "c", "c"]
    capfd.readouterr()
    assert pipeline(config, "--from_stage", "d") == 2
    assert "--from_stage d: no such stage; the stages are a, b, c" in capfd.readouterr().err


def test_dry_run_prints_the_numbered_plan_and_runs_nothing(three, capfd):
    config, run_dir = three
    assert pipeline(config) == 0
    (run_dir / "stages" / "b.done").unlink()
    capfd.readouterr()
    assert pipeline(config, "--dry_run", "true") == 0
    lines = capfd.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "1. [skip] a (finished 20" + lines[0].split("finished 20")[1].split(":")[0],
        "2. [run ] b (not finished)",
        "3. [run ] c (an earlier stage runs)",
    ]
    assert lines[1].endswith(f"{run_dir}/ran.txt")
    assert ran(run_dir) == ["a", "b", "c"] and (run_dir / "stages" / "c.done").exists()


def test_emoji_rl_stages_run_as_this_interpreters_cli():
    stage = Stage("sft", ["sft", "--config", "configs/cpu/sft.yaml"])
    assert stage.argv(cli.STAGES) == [sys.executable, "-m", "emoji_rl.cli", *stage.command]
    assert stage.display(cli.STAGES) == "emoji-rl sft --config configs/cpu/sft.yaml"
    script = Stage("gpu", ["bash", "launch/train_sft.sh"])
    assert script.argv(cli.STAGES) == script.command


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([{"name": "a"}], "stages[0] has the key(s) name; a stage has exactly: name, run"),
        ([{"name": "a", "run": "x", "cmd": "y"}], "stages[0] has the key(s) cmd, name, run"),
        (["a"], "stages[0] must be a mapping with keys name and run"),
        ([{"name": "a", "run": "x"}, {"name": "a", "run": "y"}], "stages[1].name 'a' is used twice"),
        ([{"name": "a/b", "run": "x"}], "stages[0].name 'a/b' must be letters"),
        ([{"name": "a", "run": "x 'open"}], "stages[0].run (stage a) does not split"),
        ([{"name": "a", "run": "x {rundir}/y"}], "stages[0].run (stage a) holds {rundir}: only {run_dir}"),
        ([{"name": "a", "run": " "}], "stages[0].run (stage a) must be a command line"),
        ([], "no stages"),
    ],
)
def test_a_bad_stage_list_names_the_key(tmp_path, capfd, stages, message):
    config = tmp_path / "p.yaml"
    config.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "r"), "stages": stages}))
    assert pipeline(config) == 2
    assert message in capfd.readouterr().err
    assert not (tmp_path / "r").exists()


def test_bad_yaml_names_the_file_and_line_and_an_unknown_key_the_file(tmp_path, capfd):
    config = tmp_path / "p.yaml"
    config.write_text("run_dir: r\nstages:\n  - name: a\n    run: [x\n")
    assert pipeline(config) == 2
    err = capfd.readouterr().err
    assert f"config file {config}:5: not valid YAML: expected ',' or ']'" in err
    assert "(while parsing a flow sequence on line 4)" in err
    config.write_text("run_dir: r\nstage: []\n")
    assert pipeline(config) == 2
    assert f"config file {config}: unknown key(s) stage" in capfd.readouterr().err


def test_without_a_run_dir_the_error_says_where_to_give_one(tmp_path, capfd):
    config = write_config(tmp_path / "p.yaml", [("a", append("a"))], None)
    assert pipeline(config) == 2
    assert "run_dir is not set: give it in the --config file or as --run_dir DIR" in capfd.readouterr().err


def test_a_missing_program_is_named(tmp_path, capfd):
    config = write_config(tmp_path / "p.yaml", [("a", "no-such-program-here --x")], tmp_path / "r")
    assert pipeline(config) == 2
    assert "command not found: no-such-program-here" in capfd.readouterr().err


def child_env(**extra: str) -> dict[str, str]:
    """This environment, with this checkout's src first on the path."""
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def start_runner(config: Path, env: dict[str, str]) -> subprocess.Popen:
    """`emoji-rl pipeline --config config` in a session of its own, so that a test can kill the runner's
    process group as a terminal would, or the runner alone."""
    command = [sys.executable, "-m", "emoji_rl.cli", "pipeline", "--config", str(config)]
    out = subprocess.DEVNULL
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True)


def start_sleeping_stage(tmp_path: Path) -> tuple[subprocess.Popen, int]:
    """A runner whose one stage sleeps a minute; returned once the stage runs, with the stage's pid."""
    pid_file = tmp_path / "stage.pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    config = write_config(tmp_path / "p.yaml", [("sleep", f"{PY} -c {shlex.quote(code)}")], tmp_path / "r")
    runner = start_runner(config, child_env())
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        if time.monotonic() > deadline or runner.poll() is not None:
            runner.kill()
            pytest.fail("the stage did not start")
        time.sleep(0.05)
    return runner, int(pid_file.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_stage_dies_with_the_runner_even_by_sigkill(tmp_path):
    runner, stage_pid = start_sleeping_stage(tmp_path)
    try:
        runner.send_signal(signal.SIGKILL)  # the runner alone, not its process group (its stage's too)
        runner.wait()
        deadline = time.monotonic() + 10
        while alive(stage_pid):
            assert time.monotonic() < deadline, "the stage outlived the runner"
            time.sleep(0.05)
    finally:
        runner.kill()
    assert not (tmp_path / "r" / "stages" / "sleep.done").exists()


def test_a_sigterm_to_the_runner_stops_its_stage_and_says_so_in_the_log(tmp_path):
    runner, stage_pid = start_sleeping_stage(tmp_path)
    try:
        runner.send_signal(signal.SIGTERM)  # the runner alone, as `kill PID` or a scheduler sends it
        assert runner.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        runner.kill()
    assert not alive(stage_pid)  # stopped and reaped by the runner, not left behind
    assert not (tmp_path / "r" / "stages" / "sleep.done").exists()
    last = (tmp_path / "r" / "pipeline.log").read_text().splitlines()[-1]
    assert last.startswith("== pipeline [1/1] sleep: stopped by SIGTERM after "), last


def kill_group_when(ready: Callable[[], bool], config: Path, env: dict[str, str], timeout: float) -> None:
    """Start the runner, and SIGKILL its process group (the runner and its stage) once `ready()`."""
    runner = start_runner(config, env)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert runner.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait()


# A stand-in for a training stage: 10 steps, a checkpoint after each (written atomically), resumed from
# the last one; its output is the sum of the steps.
TRAIN = """
import os, sys, time
ckpt, out = sys.argv[1], sys.argv[2]
step, total = map(int, open(ckpt).read().split()) if os.path.exists(ckpt) else (0, 0)
print("from step", step, flush=True)
while step < 10:
    step, total = step + 1, total + step * step
    time.sleep(0.05)
    open(ckpt + ".tmp", "w").write("%d %d" % (step, total))
    os.replace(ckpt + ".tmp", ckpt)
open(out, "w").write(str(total))
"""


def test_a_sigkill_of_the_runners_group_then_a_rerun_ends_as_an_uninterrupted_run_stand_ins(tmp_path):
    train = f"{PY} -c {shlex.quote(TRAIN)} {{run_dir}}/ckpt {{run_dir}}/out"
    stages = [("a", append("a")), ("train", train), ("c", append("c"))]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert run_to_end(write_config(tmp_path / "whole.yaml", stages, whole), child_env()) == 0
    config = write_config(tmp_path / "killed.yaml", stages, killed)
    ckpt = killed / "ckpt"
    kill_group_when(lambda: ckpt.exists() and int(ckpt.read_text().split()[0]) >= 3, config, child_env(), 30)
    assert not (killed / "out").exists() and not (killed / "stages/train.done").exists()
    assert run_to_end(config, child_env()) == 0
    assert (killed / "out").read_text() == (whole / "out").read_text() == str(sum(i * i for i in range(10)))
    assert ran(killed) == ran(whole) == ["a", "c"]
    log = (killed / "pipeline.log").read_text()
    assert log.count("== pipeline [1/3] a: skipped (finished ") == 1  # the rerun reads as one in the log
    assert "from step 0" in log and "from step 0" not in log.split("from step 0", 1)[1]  # resumed later


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by init, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# --- one run per directory ---------------------------------------------------------------------------

# A stage that says it runs, then waits until the test lets it finish.
WAIT = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
while not os.path.exists(sys.argv[2]):
    time.sleep(0.02)
"""


def test_a_second_run_on_a_directory_is_refused_naming_the_pid_and_a_killed_ones_lock_blocks_nothing(
    tmp_path,
):
    from types import SimpleNamespace

    run_dir, started, go = tmp_path / "r", tmp_path / "started", tmp_path / "go"
    stage = f"{PY} -c {shlex.quote(WAIT)} {started} {go}"
    config = write_config(tmp_path / "p.yaml", [("wait", stage)], run_dir)
    first = start_runner(config, child_env())
    second = [sys.executable, "-m", "emoji_rl.cli", "pipeline", "--config", str(config)]
    try:
        deadline = time.monotonic() + 30
        while not started.exists():
            assert first.poll() is None and time.monotonic() < deadline, "the first run's stage did not start"
            time.sleep(0.02)
        refused = subprocess.run(
            second, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=30
        )
        assert refused.returncode == 2, refused.stderr
        assert (
            f"emoji-rl pipeline: error: run_dir={run_dir}: {run_dir} is in use by another run "
            f"(PID {first.pid} holds {run_dir / '.lock'})" in refused.stderr
        ), refused.stderr
        assert first.poll() is None  # refused at once, with the first run untouched
        # Under accelerate or torchrun the ranks share the directory: only the global main process locks.
        outputs = SimpleNamespace(output_dir=str(run_dir))
        with cli.one_run_per_directory(outputs, {"RANK": "1", "WORLD_SIZE": "2"}):
            pass
        with (
            pytest.raises(UserError, match=f"PID {first.pid} holds"),
            cli.one_run_per_directory(outputs, {"RANK": "0", "WORLD_SIZE": "2"}),
        ):
            pass
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # the runner and its stage, as a crash would
        first.wait()
    assert (run_dir / ".lock").read_text().split()[0] == str(first.pid)  # left behind by the killed run
    go.touch()
    resumed = subprocess.run(second, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert (run_dir / "stages" / "wait.done").is_file()


def test_a_stage_the_pipeline_runs_in_its_own_run_dir_is_not_refused(tmp_path, capfd):
    # The experiment's last stage, `experiment-report --run_dir {run_dir}`, writes where the pipeline
    # runs: it fails on the empty run directory, but for want of an evaluation, not of the lock.
    run_dir = tmp_path / "r"
    config = write_config(tmp_path / "p.yaml", [("report", "experiment-report --run_dir {run_dir}")], run_dir)
    assert pipeline(config) == 2
    log = (run_dir / "pipeline.log").read_text()
    assert "retrieval.json does not exist: run `emoji-rl eval-retrieval" in log, log
    assert "in use by another run" not in log


# --- the experiment configs ------------------------------------------------------------------------------

EXPERIMENT = ["prompts", "teacher", "judge-check", "sft", "eval-sft", "eval-sft-sampled", "rl-prompts", "grpo",
              "eval-retrieval"]  # fmt: skip


def experiment_stages(profile: str, name: str = "experiment") -> list[Stage]:
    from emoji_rl.config import parse_config
    from emoji_rl.pipeline import Config, parse_stages

    cfg = parse_config(Config, ["--config", str(ROOT / f"configs/{profile}/{name}.yaml")], "pipeline")
    return parse_stages(cfg.stages, cfg.run_dir)


def printed_commands(command: list[str], gpus: int) -> list[list[str]]:
    """What a `bash launch/X.sh ...` stage runs, from its --dry-run, on a box of `gpus` GPUs."""
    assert command[0] == "bash" and command[1].startswith("launch/"), command
    dry = (
        [*command[:3], "--dry-run", *command[3:]]
        if command[1] == "launch/with_servers.sh"
        else [*command, "--dry-run"]
    )
    env = {"GPUS": str(gpus), "PATH": os.environ["PATH"], "HOME": "/tmp", "VLLM": "vllm", "PYTHON": "python3"}
    result = subprocess.run(dry, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_stage_command_of_the_experiment_parses_with_its_stage_parser(profile, monkeypatch):
    from tests.test_launch import parse_stage, stage_commands

    monkeypatch.chdir(ROOT)  # the commands name their config files from the repository root
    stages = experiment_stages(profile)
    assert [s.name for s in stages] == [*EXPERIMENT, "report"]
    parsed = []
    for stage in stages:
        if stage.command[0] in cli.STAGES:
            parsed.append(stage.command[0])
            parse_stage(stage.command[0], stage.command[1:])
            continue
        programs = set()
        for gpus in (2, 4, 8):
            found = [c for argv in printed_commands(stage.command, gpus) for c in stage_commands(argv)]
            assert len(found) == 1, (stage.name, gpus, found)
            programs.add(found[0][0])
            parse_stage(*found[0])
        assert len(programs) == 1, (stage.name, programs)
        parsed.append(programs.pop())
    run = [name.removesuffix("-sampled") for name in EXPERIMENT]  # eval-sft-sampled runs eval-sft
    assert [*run, "experiment-report"] == parsed


@pytest.mark.parametrize("pipeline", ["experiment", "wordle"])
@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_the_training_stages_resume_from_their_checkpoints(profile, pipeline):
    by_name = {s.name: s.command for s in experiment_stages(profile, pipeline)}
    for name in ("sft", "grpo"):
        assert by_name[name][-2:] == ["--resume", "true"], name


def test_the_gpu_experiment_dry_run_prints_the_sequence(capfd):
    assert cli.main(["pipeline", "--config", str(ROOT / "configs/gpu/experiment.yaml"), "--dry_run", "true",
                     "--run_dir", "/nonexistent/run"]) == 0  # fmt: skip
    lines = capfd.readouterr().out.splitlines()
    assert [line.split(" (")[0] for line in lines] == [
        f"{i:2}. [run ] {name}" for i, name in enumerate([*EXPERIMENT, "report"], 1)
    ]
    assert "bash launch/train_sft.sh --train_data /nonexistent/run/data/sft_train.jsonl" in lines[3]
    assert "launch/with_servers.sh judge,policy -- launch/train_grpo.sh" in lines[7]


@pytest.mark.parametrize(("gpus", "servers"), [(2, ["judge"]), (4, ["judge", "policy"])])
def test_with_servers_starts_the_policy_server_only_where_the_layout_has_one(gpus, servers):
    command = ["bash", "launch/with_servers.sh", "judge,policy", "--", "launch/train_grpo.sh"]
    env = {"GPUS": str(gpus), "PATH": os.environ["PATH"], "HOME": "/tmp", "VLLM": "vllm", "PYTHON": "python3"}
    dry = [*command[:3], "--dry-run", *command[3:]]
    out = subprocess.run(
        dry, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert [line.split(",")[0] for line in out.splitlines() if line.startswith("# server ")] == [
        f"# server {s}" for s in servers
    ]
    grpo = printed_commands(command, gpus)[-1]
    assert ("--engine" in grpo) == (gpus == 2)  # no policy server: rollouts in the trainer


def test_with_servers_needs_a_server_set_and_a_command():
    env = {"PATH": os.environ["PATH"], "HOME": "/tmp", "GPUS": "2"}
    for args in (["policy", "--", "x"], ["judge", "x"], ["judge", "--"]):
        result = subprocess.run(["bash", "launch/with_servers.sh", *args], cwd=ROOT, env=env,
                                capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert result.returncode == 2 and "usage: launch/with_servers.sh" in result.stderr, args


# --- a real SIGKILL in the middle of training -------------------------------------------------------------

# configs/cpu/experiment.yaml's stages up to GRPO at toy size: minutes, not an hour. The lexicon judge
# stands in for the embedded one: what is tested is how the stages resume (the whole test 160 s on one core
# beside a GRPO run). That the stages after a resumed one run is the stand-ins' test above; here the
# resumed GRPO's metrics and adapter are compared with the uninterrupted run's.
SHORT = [
    ("prompts", "prompts --source corpus --n 40 --out {run_dir}/data/prompts.jsonl"),
    ("teacher", "teacher --teacher offline --prompts {run_dir}/data/prompts.jsonl --out_dir {run_dir}/data "
                "--test_fraction 0.2"),
    ("sft", "sft --config configs/cpu/sft.yaml --train_data {run_dir}/data/sft_train.jsonl "
            "--eval_data {run_dir}/data/sft_test.jsonl --output_dir {run_dir}/sft --max_steps 1 --per_device_train_batch_size 4 "
            "--effective_batch_size 4 --save_steps 1 --resume true"),
    ("rl-prompts", "rl-prompts --prompts {run_dir}/data/prompts.jsonl --sft_test {run_dir}/data/sft_test.jsonl "
                   "--adapter {run_dir}/sft/adapter --out_dir {run_dir}/data --max_prompts 8 "
                   "--eval_fraction 0.25 --judge lexicon --min_similarity 0"),
    ("grpo", "grpo --config configs/cpu/grpo.yaml --init_adapter {run_dir}/sft/adapter "
             "--train_data {run_dir}/data/rl_train.jsonl --output_dir {run_dir}/grpo --max_turns 1 "
             "--batch_size 2 --group_size 2 --max_steps 2 --save_steps 1 --judge lexicon --resume true"),
]  # fmt: skip


def finished(run_dir: Path) -> tuple[list[tuple[str, list[str]]], list[dict], dict[str, list]]:
    """The markers (name, command), GRPO's metrics without their timings, and its adapter's weights."""
    from safetensors.torch import load_file

    markers = []
    for name, _ in SHORT:
        marker = json.loads((run_dir / "stages" / f"{name}.done").read_text())
        markers.append((marker["name"], marker["command"]))
    metrics = [json.loads(line) for line in (run_dir / "grpo/metrics.jsonl").read_text().splitlines()]
    untimed = [{k: v for k, v in m.items() if not k.startswith(("time/", "throughput/"))} for m in metrics]
    adapter = load_file(run_dir / "grpo/adapter/adapter_model.safetensors")
    return markers, untimed, {name: tensor.tolist() for name, tensor in adapter.items()}


# Measured: the whole test took 136 s on one idle core, and its first run alone 32 minutes on 2 cores
# shared with three other torch jobs: a bound for a busy machine, not for a hung stage.
TIMEOUT_S = 3600


def run_to_end(config: Path, env: dict[str, str]) -> int:
    runner = start_runner(config, env)
    try:
        return runner.wait(timeout=TIMEOUT_S)
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()


@pytest.mark.slow
def test_a_sigkill_in_the_middle_of_grpo_then_a_rerun_ends_as_an_uninterrupted_run(tmp_path):
    env = child_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    run_dir, whole = tmp_path / "run", tmp_path / "whole"
    config = write_config(tmp_path / "short.yaml", SHORT, run_dir)
    assert run_to_end(config, env) == 0
    # The uninterrupted run kept aside; the second run reuses its stages up to GRPO (same run dir, so the
    # same commands), to spend the test's minutes on the interrupted stage.
    shutil.copytree(run_dir, whole)
    (run_dir / "stages/grpo.done").unlink()
    shutil.rmtree(run_dir / "grpo")

    # After GRPO's first checkpoint, during its second step.
    kill_group_when((run_dir / "grpo/checkpoints/latest").exists, config, env, TIMEOUT_S)
    assert not (run_dir / "stages/grpo.done").exists() and not (run_dir / "grpo/adapter").exists()
    assert run_to_end(config, env) == 0

    log = (run_dir / "pipeline.log").read_text()
    # The whole run, the killed one, the rerun; the stages before GRPO ran once.
    assert log.count("== pipeline [5/5] grpo: emoji-rl grpo") == 3
    assert log.count("== pipeline [4/5] rl-prompts: emoji-rl") == 1
    assert finished(run_dir) == finished(whole)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        (["experiment"], "emoji-rl pipeline --config configs/cpu/experiment.yaml"),
        (["experiment", "PROFILE=gpu"], "emoji-rl pipeline --config configs/gpu/experiment.yaml"),
        (["wordle"], "emoji-rl pipeline --config configs/cpu/wordle.yaml"),
        (["wordle", "PROFILE=gpu"], "emoji-rl pipeline --config configs/gpu/wordle.yaml"),
        (
            ["pipeline", "CONFIG=my.yaml", "ARGS=--dry_run true"],
            "emoji-rl pipeline --config my.yaml --dry_run true",
        ),
    ],
)
def test_make_experiment_and_pipeline(variables, expected):
    result = subprocess.run(["make", "-n", "-f", "launch/targets.mk", *variables], cwd=ROOT,
                            capture_output=True, text=True, check=True, timeout=30)  # fmt: skip
    [line] = [line.rstrip() for line in result.stdout.splitlines() if "emoji-rl pipeline" in line]
    assert line.endswith(expected)
    # A CONFIG in the environment would become the launch scripts' stage config.
    assert line.startswith("env -u CONFIG ")
    assert ("HF_HUB_OFFLINE=1" in line) == ("PROFILE=gpu" not in variables)
