"""`emoji-rl judge-check`: the messages file and a CLI smoke run (lexicon judge)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from emoji_rl import cli
from emoji_rl.errors import DataError, UserError
from emoji_rl.eval.judge_check import DEFAULT_MESSAGES, read_messages
from emoji_rl.lm import models
from emoji_rl.play.guessing import NAMES_CAVEAT

SAMPLES = Path(__file__).resolve().parents[2] / DEFAULT_MESSAGES


def test_sample_messages_are_everyday_chat_of_6_to_25_words():
    messages = read_messages(SAMPLES)
    assert len(messages) >= 30
    assert all(6 <= len(m.split()) <= 25 for m in messages)


def test_read_messages_skips_blank_lines_and_duplicates(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text("first message here\n\n  second one  \nfirst message here\n")
    assert read_messages(path) == ["first message here", "second one"]


@pytest.mark.parametrize("content", [None, "", "\n  \n", "only one message\n"])
def test_unusable_messages_file_is_an_error_naming_it(tmp_path, content):
    path = tmp_path / "messages.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=str(path)):
        read_messages(path)


@pytest.fixture
def shared_embedder(monkeypatch, embedder):
    """The session's MiniLM instead of a fresh load per CLI run."""
    monkeypatch.setattr(models, "load_embedder", lambda *args, **kwargs: embedder)


def test_cli_lexicon_judge_check_prints_the_gap_and_writes_a_report(tmp_path, capsys, shared_embedder):
    report = tmp_path / "report.json"
    code = cli.main(
        ["judge-check", "--judge", "lexicon", "--messages", str(SAMPLES), "--output", str(report)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "teacher emoji" in out and "random emoji" in out and "gap" in out and NAMES_CAVEAT in out
    data = json.loads(report.read_text())
    assert data["judge"] == "lexicon" and data["caveat"] == NAMES_CAVEAT
    assert len(data["rows"]) == len(read_messages(SAMPLES))
    assert data["metrics"]["gap/sim_mean"] >= 0.15
    assert data["metrics"]["teacher/retrieval@1"] > data["metrics"]["random/retrieval@1"]


def test_cli_fails_when_the_gap_is_below_min_gap(tmp_path, capsys, shared_embedder):
    few = tmp_path / "few.txt"
    few.write_text("\n".join(read_messages(SAMPLES)[:4]))
    code = cli.main(["judge-check", "--judge", "lexicon", "--messages", str(few), "--min_gap", "0.99"])
    captured = capsys.readouterr()
    assert code == 2
    assert "FAIL: gap" in captured.out and "min_gap=0.99" in captured.err


def test_cli_missing_messages_file_is_a_clean_error(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    assert cli.main(["judge-check", "--judge", "lexicon", "--messages", str(missing)]) == 2
    assert str(missing) in capsys.readouterr().err


def test_cli_lexicon_judge_has_no_raw_view(capsys):
    assert (
        cli.main(["judge-check", "--judge", "lexicon", "--judge_view", "raw", "--messages", str(SAMPLES)])
        == 2
    )
    assert "judge_view=raw does not apply to judge=lexicon" in capsys.readouterr().err


def test_messages_from_jsonl_records(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"text": "first message here"}\n{"target": "second one"}\n')
    assert read_messages(path) == ["first message here", "second one"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"id": 3}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: record has neither"):
        read_messages(bad)
