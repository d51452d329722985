import json
import os

import pytest

from emoji_rl.errors import DataError, UserError
from emoji_rl.io.jsonl import (
    AppendLog,
    drop_steps_after,
    keep_first_lines,
    last_step,
    read_jsonl,
    write_json,
    write_jsonl,
)
from emoji_rl.io.metrics import MetricsWriter
from emoji_rl.io.trackers import TrackerConfig


def test_round_trip_keeps_unicode(tmp_path):
    path = tmp_path / "a.jsonl"
    assert write_jsonl(path, [{"text": "pizza", "emoji": "🍕 🎬"}, {"n": 2}]) == 2
    assert read_jsonl(path) == [{"text": "pizza", "emoji": "🍕 🎬"}, {"n": 2}]
    assert "🍕" in path.read_text(encoding="utf-8")


def test_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n{"a": 3}\n')
    with pytest.raises(DataError) as err:
        read_jsonl(path)
    assert (err.value.path, err.value.line) == (str(path), 3)
    assert f"{path}:3: not valid JSON" in str(err.value)


def test_a_line_that_is_not_an_object_is_an_error(tmp_path):
    path = tmp_path / "list.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=r":2: expected a JSON object, got list"):
        read_jsonl(path)


def test_parse_errors_name_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"n": 1}\n{"m": 2}\n')
    with pytest.raises(DataError, match=r":2: missing field 'n'"):
        read_jsonl(path, lambda r: int(r["n"]))


def test_empty_and_missing_files_are_clear_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(UserError, match=r"empty.jsonl holds no records: run `emoji-rl prompts` first"):
        read_jsonl(empty, hint="run `emoji-rl prompts` first")
    assert read_jsonl(empty, allow_empty=True) == []
    with pytest.raises(UserError, match="does not exist"):
        read_jsonl(tmp_path / "missing.jsonl")


def test_cut_off_last_line_says_what_to_do(tmp_path):
    path = tmp_path / "cut.jsonl"
    path.write_text('{"a": 1}\n{"a": 2, "b')
    with pytest.raises(DataError, match=r":2: .*no newline, so a write was probably cut short: rerun"):
        read_jsonl(path)


def test_a_complete_last_line_without_newline_is_read(tmp_path):
    path = tmp_path / "hand.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path):
    path = tmp_path / "out.jsonl"
    write_jsonl(path, [{"v": 1}])

    def records():
        yield {"v": 2}
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_jsonl(path, records())
    assert read_jsonl(path) == [{"v": 1}]
    assert os.listdir(tmp_path) == ["out.jsonl"]  # no temp file left behind


def test_atomic_write_failing_mid_write_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    write_json(path, {"v": 1})
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        write_json(path, {"v": 2})
    assert json.loads(path.read_text()) == {"v": 1}
    assert os.listdir(tmp_path) == ["state.json"]


def test_append_log_resumes_and_recovers_from_an_interrupted_append(tmp_path, caplog):
    path = tmp_path / "log.jsonl"
    with AppendLog(path) as log:
        assert log.records == []
        log.append({"i": 1})
        log.append({"i": 2})
    # A run killed mid-append leaves half a line; the next run cuts it off and goes on.
    with path.open("a") as f:
        f.write('{"i": 3, "tex')
    with AppendLog(path) as log:
        assert log.records == [{"i": 1}, {"i": 2}]
        log.append({"i": 3})
    assert "interrupted append" in caplog.text
    assert read_jsonl(path) == [{"i": 1}, {"i": 2}, {"i": 3}]


def test_append_log_recovers_from_a_cut_multibyte_character(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_bytes('{"e": "🍕"}\n{"e": "'.encode() + "🍕".encode()[:2])
    with AppendLog(path) as log:
        assert log.records == [{"e": "🍕"}]


def test_append_log_still_rejects_a_bad_complete_line(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"i": 1}\nnot json\n{"i": 3}\n')
    with pytest.raises(DataError, match=r"log.jsonl:2: not valid JSON"):
        AppendLog(path)


def test_drop_steps_after_keeps_earlier_steps_byte_for_byte_and_replaces_the_file(tmp_path):
    path = tmp_path / "metrics.jsonl"
    kept = '{"step": 1, "e": "🍕"}\n{"step": 2, "loss": 0.5}\n{"step": 2, "eval": 0.25}\n'
    # Steps 3 and 4 were logged after the checkpoint at step 2; the run died mid-way through a line.
    path.write_text(kept + '{"step": 3}\n{"step": 4}\n{"step": 5, "lo', encoding="utf-8")
    inode = path.stat().st_ino
    assert drop_steps_after(path, 2) == 3
    assert path.read_text(encoding="utf-8") == kept
    assert path.stat().st_ino != inode  # a new file renamed into place, never truncated in place
    assert os.listdir(tmp_path) == ["metrics.jsonl"]


def test_drop_steps_after_leaves_a_log_with_nothing_to_drop_untouched(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n')
    inode = path.stat().st_ino
    assert drop_steps_after(path, 2) == 0
    assert path.stat().st_ino == inode
    assert drop_steps_after(tmp_path / "missing.jsonl", 0) == 0
    assert drop_steps_after(path, -1) == 2 and path.read_text() == ""  # a fresh run keeps nothing


def test_drop_steps_after_names_a_line_without_a_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"loss": 0.5}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: a training log line needs an integer `step`"):
        drop_steps_after(path, 1)


def test_last_step_reads_whole_lines_and_names_a_line_without_a_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert last_step(path) == 0
    path.write_text('{"step": 1}\n{"step": 4}\n{"step": 3}\n{"step": 9, "lo')  # 9 was never whole
    assert last_step(path) == 4
    path.write_text('{"step": 1}\n{"loss": 0.5}\n')
    with pytest.raises(DataError, match=r"metrics.jsonl:2: a training log line needs an integer `step`"):
        last_step(path)
    with pytest.raises(DataError, match=r"metrics.jsonl:2: a training log line needs an integer `step`"):
        MetricsWriter(tmp_path, resume_from_step=1, trackers=TrackerConfig(report_to=["none"]))


def test_keep_first_lines_drops_what_came_after_the_checkpoint_at_its_own_step(tmp_path):
    path = tmp_path / "metrics.jsonl"
    # The checkpoint at step 2 knows three lines; the summary and the last eval, also at step 2, came
    # after it and go, which drop_steps_after(path, 2) would keep.
    kept = '{"step": 0, "eval": 1.0}\n{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n'
    path.write_text(kept + '{"step": 2, "train_loss": 0.45}\n{"step": 2, "eval": 0.3}\n{"step": 3, "lo')
    assert keep_first_lines(path, 3) == 3
    assert path.read_text() == kept
    assert keep_first_lines(path, 3) == 0 and keep_first_lines(path, 0) == 3 and path.read_text() == ""
