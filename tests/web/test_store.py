"""The answer store: one row per answer, refusals for double submits and stale pages, crash safety."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from emoji_rl.web.store import SCORED_COLUMNS, DuplicateAnswer, StaleAnswer, Store, Turn


def _round(store: Store, mode="guess", target="Let's grab pizza tonight"):
    return store.new_round(
        mode=mode,
        player="ann",
        sender="sft",
        adapter="runs/sft/adapter",
        adapter_hash="abc",
        target_id="t1",
        target=target,
        max_turns=3,
    )


def _answer(store: Store, round_id: str, turn: int, text="pizza tonight?"):
    return store.add_answer(
        round_id, turn, emoji="🍕 🌙", text=text, similarity=0.8, judge_guess="pizza", judge_similarity=0.5
    )


def test_answer_row_carries_the_round(tmp_path):
    store = Store(tmp_path / "a.db")
    r = _round(store)
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    row = _answer(store, r.round_id, 1)
    (stored,) = store.answers()
    assert stored == row
    assert (stored["sender"], stored["adapter_hash"], stored["target_id"], stored["turn"]) == (
        "sft",
        "abc",
        "t1",
        1,
    )
    assert stored["answered_at"] > 0


def test_answers_can_read_some_columns_and_only_the_tables(tmp_path):
    store = Store(tmp_path / "a.db")
    r = _round(store)
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    _answer(store, r.round_id, 1)
    assert store.answers(columns=SCORED_COLUMNS) == [
        {"turn": 1, "mode": "guess", "player": "ann", "sender": "sft", "judge_similarity": 0.5}
    ]
    with pytest.raises(ValueError, match=r"no such answer columns: \['1; DROP TABLE answers'\]"):
        store.answers(columns=("turn", "1; DROP TABLE answers"))
    assert len(store.answers()) == 1


def test_wal_mode(tmp_path):
    Store(tmp_path / "a.db")
    assert sqlite3.connect(tmp_path / "a.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_double_submit_is_refused_and_stores_one_row(tmp_path):
    store = Store(tmp_path / "a.db")
    r = _round(store)
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    _answer(store, r.round_id, 1)
    with pytest.raises(DuplicateAnswer, match="answered already"):
        _answer(store, r.round_id, 1, text="again")
    assert [a["text"] for a in store.answers()] == ["pizza tonight?"]


def test_unique_key_holds_without_the_check(tmp_path):
    # A second server on the same file, or a bug in the check, must still not duplicate a row.
    store = Store(tmp_path / "a.db")
    r = _round(store)
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    _answer(store, r.round_id, 1)
    db = sqlite3.connect(tmp_path / "a.db")
    with pytest.raises(sqlite3.IntegrityError):
        db.execute(
            "INSERT INTO answers (round_id, turn, mode, player, sender, target_id, target, emoji, text, "
            "similarity, judge_guess, judge_similarity, answered_at) VALUES (?, 1, 'guess', 'x', 'x', 't1', "
            "'x', 'x', 'x', 0, 'x', 0, 0)",
            (r.round_id,),
        )


def test_stale_pages_are_refused(tmp_path):
    store = Store(tmp_path / "a.db")
    with pytest.raises(StaleAnswer, match="does not know its round"):
        _answer(store, "no-such-round", 1)
    r = _round(store)
    with pytest.raises(StaleAnswer, match="has not been written yet"):
        _answer(store, r.round_id, 1)  # the sender has not written turn 1 yet
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    _answer(store, r.round_id, 1)
    store.add_turn(r.round_id, Turn(2, "🍕 🎬", "pizza and a movie", 0.6))
    with pytest.raises(StaleAnswer, match="answers turn 3, the round is at turn 2"):
        _answer(store, r.round_id, 3)
    assert len(store.answers()) == 1


def test_quotes_and_markup_are_stored_verbatim(tmp_path):
    store = Store(tmp_path / "a.db")
    r = _round(store, target='it\'s "fine"; DROP TABLE answers; --')
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    _answer(store, r.round_id, 1, text="<script>alert('x')</script> '); DROP TABLE rounds; --")
    (row,) = store.answers()
    assert row["text"] == "<script>alert('x')</script> '); DROP TABLE rounds; --"
    assert row["target"] == 'it\'s "fine"; DROP TABLE answers; --'


def test_export_jsonl(tmp_path):
    store = Store(tmp_path / "a.db")
    r = _round(store)
    store.add_turn(r.round_id, Turn(1, "🍕 🌙", "pizza", 0.5))
    _answer(store, r.round_id, 1)
    assert store.export_jsonl(tmp_path / "out.jsonl") == 1
    (line,) = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(line) == store.answers()[0]


def test_counts_for_balancing(tmp_path):
    store = Store(tmp_path / "a.db")
    _round(store)
    _round(store)
    _round(store, mode="send")
    assert store.rounds_per_sender("guess") == {"sft": 2}
    assert store.rounds_per_target("guess", "sft") == {"t1": 2}
    assert store.rounds_per_target("guess", "rl") == {}


def test_not_a_database_is_a_clear_error(tmp_path):
    bad = tmp_path / "notes.db"
    bad.write_text("hello, this is not SQLite" * 100)
    with pytest.raises(Exception, match=r"notes\.db.*play-web database"):
        Store(bad)


def test_a_committed_answer_survives_a_killed_process(tmp_path):
    """The child stores an answer, says so, and is SIGKILLed mid-run (no close, no atexit): the row
    it reported is in the file when the next process opens it."""
    child = textwrap.dedent(
        f"""
        import sys, time
        from emoji_rl.web.store import Store, Turn
        store = Store({str(tmp_path / "a.db")!r})
        r = store.new_round(mode="guess", player="ann", sender="rl", adapter=None, adapter_hash=None,
                            target_id="t9", target="see you at nine", max_turns=1)
        store.add_turn(r.round_id, Turn(1, "👀 9️⃣", "see you", 0.7))
        store.add_answer(r.round_id, 1, emoji="👀 9️⃣", text="see you at 9", similarity=0.9,
                         judge_guess="see you", judge_similarity=0.7)
        print("stored", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        assert proc.stdout.readline().strip() == "stored"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    (row,) = Store(tmp_path / "a.db").answers()
    assert (row["text"], row["target_id"], row["sender"]) == ("see you at 9", "t9", "rl")
