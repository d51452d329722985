"""The path one GRPO step takes through the package, traced as it runs (docs/ARCHITECTURE.md, "One GRPO
step"): no call climbs back up the layers. The import rule (tests/test_imports.py) cannot see a call
made through an object or a callback handed down; this run sees every call from one emoji_rl file into
another, from the command line to the saved adapter."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tests.test_imports import RANKS, top

import emoji_rl

SRC = Path(emoji_rl.__file__).parent


_MODULES: dict[str, str | None] = {}


def _module(filename: str) -> str | None:
    """The emoji_rl module of a code object's file, or None; cached, as the profiler asks per call."""
    if filename not in _MODULES:
        path = Path(filename)
        parts = path.relative_to(SRC.parent).with_suffix("").parts if path.is_relative_to(SRC) else None
        _MODULES[filename] = ".".join(parts[:-1] if parts[-1] == "__init__" else parts) if parts else None
    return _MODULES[filename]


@pytest.mark.slow
def test_one_grpo_step_never_calls_up_a_layer(tmp_path, capsys):
    from emoji_rl import cli

    data = tmp_path / "rl.jsonl"
    data.write_text(json.dumps({"id": "t0", "target": "let's get pizza tonight"}) + "\n")
    args = ["grpo", "--train_data", str(data), "--output_dir", str(tmp_path / "run"), "--max_steps", "1"]
    args += [
        "--batch_size",
        "1",
        "--group_size",
        "2",
        "--max_turns",
        "2",
        "--lora_r",
        "4",
        "--save_steps",
        "1",
    ]
    upward: set[str] = set()
    called: set[str] = set()

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee = _module(frame.f_code.co_filename)
        if callee is None:
            return
        caller = _module(frame.f_back.f_code.co_filename) if frame.f_back else None
        called.add(f"{callee}.{frame.f_code.co_name}")
        # cli.py hands over to the stage's main: the one call that starts above the layers it enters.
        if caller is None or caller == callee or caller == "emoji_rl.cli":
            return
        if RANKS[top(callee)] > RANKS[top(caller)]:
            upward.add(f"{caller} -> {callee}.{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        code = cli.main(args)
    finally:
        sys.setprofile(None)
    assert code == 0, capsys.readouterr().err
    # The step ran whole: the sender sampled, the hf judge guessed, the update took its gradient.
    assert {
        "emoji_rl.decode.sampler.sample",
        "emoji_rl.games.retrieval.judge.guess",
        "emoji_rl.rl.update.update",
    } <= called
    assert not upward, "calls that climb a layer:\n" + "\n".join(sorted(upward))
