"""The path a GRPO step takes through the package, traced as it runs (docs/ARCHITECTURE.md, "One GRPO
step, as a reader follows it"): no call climbs back up the layers, and the files the step runs in are
the ones that section's table lists. The import rule (tests/test_imports.py) cannot see a call made
through an object or a callback handed down; this run sees every call from one emoji_rl file into
another, from the command line to the saved adapter, in every thread the trainer starts: the rollout
thread of a run one version behind its server too (`threading.setprofile`)."""

from __future__ import annotations

import inspect
import json
import re
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.test_imports import RANKS, top

import emoji_rl

SRC = Path(emoji_rl.__file__).parent
ARCHITECTURE = SRC.parents[1] / "docs" / "ARCHITECTURE.md"
STEP_SECTION = "## One GRPO step, as a reader follows it"
# The threads a run's step work is done in besides the loop's: the rollout thread (rl/rollout/schedule.py)
# and the executor an in-process judge decodes on (asyncio.to_thread). Not the fake server's.
STEP_THREADS = ("rollouts-ahead", "asyncio_")

_MODULES: dict[str, str | None] = {}


def _module(filename: str) -> str | None:
    """The emoji_rl module of a code object's file, or None; cached, as the profiler asks per call."""
    if filename not in _MODULES:
        path = Path(filename)
        parts = path.relative_to(SRC.parent).with_suffix("").parts if path.is_relative_to(SRC) else None
        _MODULES[filename] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) if parts else None
    return _MODULES[filename]


@dataclass
class Trace:
    """What a profiled run called: the calls that climbed a rank, every function called (with the
    thread that called it), and the files the loop's steps ran in."""

    upward: set[str] = field(default_factory=set)
    called: set[tuple[str, str]] = field(default_factory=set)
    step_files: set[str] = field(default_factory=set)
    in_loop: bool = False

    def __call__(self, frame, event, _arg) -> None:
        if event not in ("call", "return"):
            return
        code = frame.f_code
        callee = _module(code.co_filename)
        if callee is None:
            return
        thread = threading.current_thread().name
        if callee == "emoji_rl.rl.train" and code.co_name == "_loop" and thread == "MainThread":
            self.in_loop = event == "call"
        if event != "call":
            return
        self.called.add((thread, f"{callee}.{code.co_name}"))
        # A function's code, not a module's or a class body's: a lazy import is not where a step runs.
        is_function = code.co_flags & inspect.CO_NEWLOCALS
        if is_function and ((self.in_loop and thread == "MainThread") or thread.startswith(STEP_THREADS)):
            self.step_files.add(str(Path(code.co_filename).relative_to(SRC)))
        caller = _module(frame.f_back.f_code.co_filename) if frame.f_back else None
        # cli.py hands over to the stage's main: the one call that starts above the layers it enters.
        if caller is None or caller == callee or caller == "emoji_rl.cli":
            return
        if RANKS[top(callee)] > RANKS[top(caller)]:
            self.upward.add(f"{caller} -> {callee}.{code.co_name}")

    def run(self, args: list[str]) -> int:
        from emoji_rl import cli

        sys.setprofile(self)
        threading.setprofile(self)
        try:
            return cli.main(args)
        finally:
            threading.setprofile(None)
            sys.setprofile(None)


def documented_step_files(text: str) -> dict[str, set[str]]:
    """The files of the step table in `text` (docs/ARCHITECTURE.md), by engine: a file marked `(hf)` or
    `(vllm)` runs on that engine's path only, any other on both."""
    section = text.split(STEP_SECTION, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and ".py`" in line]
    found = [
        (name, engine)
        for row in rows
        for name, engine in re.findall(r"`([\w/]+\.py)`(?: \((hf|vllm)\))?", row)
    ]
    return {engine: {name for name, only in found if only in ("", engine)} for engine in ("hf", "vllm")}


def test_the_table_reader_tells_each_engines_files_apart():
    text = (
        f"{STEP_SECTION}\n\n| rank | files |\n|---|---|\n| 5 | `rl/train.py`, `rl/a.py` (vllm) |\n"
        "| 3 | `decode/b.py` (hf) |\n\n## Next\n\n| 0 | `io/c.py` |\n"
    )
    assert documented_step_files(text) == {
        "hf": {"rl/train.py", "decode/b.py"},
        "vllm": {"rl/train.py", "rl/a.py"},
    }


def _args(tmp_path: Path) -> list[str]:
    data = tmp_path / "rl.jsonl"
    data.write_text(json.dumps({"id": "t0", "target": "let's get pizza tonight"}) + "\n")
    settings = {"batch_size": 1, "group_size": 2, "max_turns": 2, "lora_r": 4, "save_steps": 1}
    return [
        "grpo",
        "--train_data",
        str(data),
        "--output_dir",
        str(tmp_path / "run"),
        *(item for key, value in settings.items() for item in (f"--{key}", str(value))),
    ]


def _check(trace: Trace, engine: str) -> None:
    assert not trace.upward, "calls that climb a layer:\n" + "\n".join(sorted(trace.upward))
    documented = documented_step_files(ARCHITECTURE.read_text())[engine]
    assert trace.step_files == documented, (
        f"{ARCHITECTURE.name}'s step table is not the {engine} step's files: the step ran in "
        f"{sorted(trace.step_files - documented)} that it does not list, and not in "
        f"{sorted(documented - trace.step_files)} that it lists"
    )


@pytest.mark.slow
def test_one_grpo_step_never_calls_up_a_layer(tmp_path, capsys):
    trace = Trace()
    code = trace.run([*_args(tmp_path), "--max_steps", "1"])
    assert code == 0, capsys.readouterr().err
    called = {function for _, function in trace.called}
    # The step ran whole: the sender sampled, the hf judge guessed, the update took its gradient.
    assert {
        "emoji_rl.decode.sampler.sample",
        "emoji_rl.play.judge.guess",
        "emoji_rl.rl.update.update",
    } <= called
    _check(trace, "hf")


@pytest.mark.slow
def test_steps_one_version_behind_the_server_never_call_up_a_layer_in_the_rollout_thread(
    tmp_path, capsys, monkeypatch, smollm2_tokenizer
):
    from tests.fakes.fake_lm import FakeLM
    from tests.fakes.vllm_server import FakeVLLMServer

    monkeypatch.setenv("POLICY_API_KEY", "test-key")
    trace = Trace()
    with FakeVLLMServer(FakeLM(smollm2_tokenizer), logprobs_mode="processed_logprobs") as server:
        engine = ["--engine", "vllm", "--vllm_url", server.url, "--max_off_policy_steps", "1"]
        code = trace.run([*_args(tmp_path), "--max_steps", "2", *engine])
    assert code == 0, capsys.readouterr().err
    # The rollout thread sampled from the server and the judge read its messages there, seen by the
    # profiler; the loop's thread updated and published the next version.
    assert {
        ("rollouts-ahead", "emoji_rl.decode.vllm.sample"),
        ("rollouts-ahead", "emoji_rl.play.judge.guess"),
        ("MainThread", "emoji_rl.rl.update.update"),
        ("MainThread", "emoji_rl.rl.rollout.vllm.publish"),
    } <= trace.called
    _check(trace, "vllm")
