"""JSONL and JSON files for every stage: strict reads, atomic writes, crash-safe append logs.

    records = read_jsonl(path, hint="run `emoji-rl prompts` first")  # list of dicts
    prompts = read_jsonl(path, Prompt.from_record)  # typed records; a bad field names its line
    write_jsonl(path, records)          # all or nothing: temp file in the same dir, fsync, rename
    write_json(path, obj)               # the same, for one JSON document (stats, state files)
    with AppendLog(path) as log:        # resumable output: one fsynced line per record
        done = log.records              # what earlier runs wrote
        log.append({"id": ..., ...})
    drop_steps_after(path, k)           # a training log resumed at step k: later lines go, atomically
    last_step(path)                     # the last step a training log holds (before dropping any)
    keep_first_lines(path, n)           # the same, by count: a log that matches a checkpoint's history
    rewrite_records(path, change)       # each record through `change`, atomically (a resumed old log)

Errors: a missing or empty file is a `UserError` that says what makes the file (`hint`); a line that
is not a JSON object is a `DataError` naming the file and the line. Only an append log may end in a
line without its newline, left by a run killed mid-append: opening the log drops that line (it was
never complete, so the record is redone), and `read_jsonl` on such a file names the line and the fix.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from emoji_rl.errors import DataError, UserError

log = logging.getLogger(__name__)

Record = dict[str, Any]
T = TypeVar("T")


def _as_is(record: Record) -> Record:
    return record


def _parse_lines(path: Path, data: bytes) -> list[tuple[int, Record]]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(path, data.count(b"\n", 0, err.start) + 1, "not valid UTF-8") from None
    records: list[tuple[int, Record]] = []
    lines = text.split("\n")
    # A file written by this module ends in "\n", so the last split item is empty; anything else
    # there is a line whose write may have been cut short.
    tail = lines.pop()
    for number, line in enumerate(lines, start=1):
        if line.strip():
            records.append((number, _parse_line(path, number, line)))
    if tail.strip():
        try:
            records.append((len(lines) + 1, _parse_line(path, len(lines) + 1, tail)))
        except DataError as err:
            raise DataError(
                path,
                err.line,
                f"{err.reason}; the last line has no newline, so a write was probably cut short: "
                "rerun the stage that makes this file, or delete that line",
            ) from None
    return records


def _parse_line(path: Path, number: int, line: str) -> Record:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(path, number, f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(value, dict):
        raise DataError(path, number, f"expected a JSON object, got {type(value).__name__}")
    return value


def read_jsonl(
    path: str | Path, parse: Callable[[Record], T] = _as_is, hint: str = "", allow_empty: bool = False
) -> list[T]:
    """Every record of a JSONL file, each passed through `parse` (e.g. `Prompt.from_record`); blank
    lines are skipped. A `ValueError`, `KeyError` or `TypeError` from `parse` becomes a `DataError`
    naming the line. `hint` (e.g. "run `emoji-rl prompts` first") ends the error for a missing or
    empty file."""
    path = Path(path)
    suffix = f": {hint}" if hint else ""
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a file of records; name the JSONL file{suffix}")
    if not path.is_file():
        raise UserError(f"{path} does not exist{suffix}")
    numbered = _parse_lines(path, path.read_bytes())
    if not numbered and not allow_empty:
        raise UserError(f"{path} holds no records{suffix}")
    parsed = []
    for number, record in numbered:
        try:
            parsed.append(parse(record))
        except KeyError as err:
            raise DataError(path, number, f"missing field {err}") from None
        except (ValueError, TypeError) as err:
            raise DataError(path, number, str(err)) from None
    return parsed


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """A new file to write beside `path`; when the block ends without an error it replaces `path`
    atomically, and on an error it is removed and `path` stays as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same directory, so the rename is atomic: readers see the old file or the new one, never half.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file owner-only; give it the usual mode of a data file (or the old file's).
        os.fchmod(fd, path.stat().st_mode & 0o777 if path.exists() else 0o644)
        os.close(fd)
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text`, atomically."""
    with replacing(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def write_jsonl(path: str | Path, records: Iterable[Record]) -> int:
    """Replace `path` with one JSON object per line, atomically; returns the number of records."""
    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in records]
    write_text(Path(path), "".join(lines))
    return len(lines)


def write_json(path: str | Path, obj: object) -> None:
    """Replace `path` with one indented JSON document, atomically."""
    write_text(Path(path), json.dumps(obj, ensure_ascii=False, indent=2) + "\n")


def drop_steps_after(path: str | Path, step: int) -> int:
    """Keep the lines of a training log whose `step` is at most `step`, atomically; returns how many
    went. A run resumed from its checkpoint at step k redoes the steps after k, so the lines the
    interrupted run logged for them would otherwise appear twice. A last line without its newline was
    cut short by the interruption and goes too. Kept lines stay byte for byte; no file, no change."""

    path = Path(path)
    return _keep_lines(
        path, lambda number, record: _log_step(path, number, record) <= step, f"after step {step}"
    )


def last_step(path: str | Path) -> int:
    """The last step a training log's whole lines hold (0: none, or no file): what a run that died
    after writing them had already reported elsewhere."""
    return max(logged_steps(path), default=0)


def logged_steps(path: str | Path) -> list[int]:
    """The step of each whole line of a training log, in order (none: no file)."""
    return [record["step"] for record in training_log(path)]


def training_log(path: str | Path) -> list[Record]:
    """The whole lines of a training log, in order (none: no file), each with an integer `step`: what
    a run killed while it wrote the last had logged."""
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    numbered = _parse_lines(path, data[: data.rfind(b"\n") + 1])
    for number, record in numbered:
        _log_step(path, number, record)
    return [record for _, record in numbered]


def _log_step(path: Path, number: int, record: Record) -> int:
    step = record.get("step")
    if not isinstance(step, int):
        raise DataError(path, number, "a training log line needs an integer `step`")
    return step


def keep_first_lines(path: str | Path, count: int) -> int:
    """Keep the first `count` lines of a training log, atomically; returns how many went. For a log
    whose lines match a checkpoint's own record of them one for one (a Trainer's log history): lines
    logged at the checkpoint's step but after it was saved (a closing summary, a last evaluation) go,
    which `drop_steps_after` would keep. Otherwise as `drop_steps_after`."""
    return _keep_lines(Path(path), lambda number, record: number <= count, f"after the first {count}")


def _keep_lines(path: Path, keep: Callable[[int, Record], bool], which: str) -> int:
    if not path.is_file():
        return 0
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    numbered = _parse_lines(path, complete)
    lines = complete.decode("utf-8").split("\n")
    kept = [lines[number - 1] + "\n" for number, record in numbered if keep(number, record)]
    text = "".join(kept)
    if text.encode("utf-8") != data:
        write_text(path, text)
    dropped = len(numbered) - len(kept) + (len(complete) < len(data))
    if dropped:
        log.info("%s: dropped %d line(s) %s, which the resumed run redoes", path, dropped, which)
    return dropped


def rewrite_records(path: str | Path, change: Callable[[Record], Record]) -> int:
    """Pass each record of a JSONL file through `change` and rewrite the file, atomically, if any
    changed; returns how many did. The other lines stay byte for byte."""
    path = Path(path)
    if not path.is_file():
        return 0
    data = path.read_bytes()
    lines = data.decode("utf-8").split("\n")  # numbered as _parse_lines numbers them
    changed = 0
    for number, record in _parse_lines(path, data):
        new = change(record)
        if new != record:
            lines[number - 1] = json.dumps(new, ensure_ascii=False)
            changed += 1
    if changed:
        write_text(path, "\n".join(lines))
    return changed


class AppendLog:
    """A JSONL file that grows one fsynced record at a time, so a rerun resumes where a crash stopped.

    Opening it reads what is there (`records`) and cuts off an unfinished last line, so the next
    append starts on a line of its own. Each `append` is written, flushed and fsynced before it
    returns (about 0.3 ms here): a record that `append` returned for survives a crash.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        data = self.path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            log.warning("%s: cutting off %d bytes of an interrupted append", self.path, len(data) - keep)
            with self.path.open("r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())
        self.records: list[Record] = [r for _, r in _parse_lines(self.path, data[:keep])]
        self._file = self.path.open("a", encoding="utf-8")

    def append(self, record: Record) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        self.records.append(record)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def read_records(path: str, key: str, hint: str) -> list[dict[str, str]]:
    """The training records, each with a non-empty string `key` (checked here, before any model loads)."""
    records = read_jsonl(path, hint=hint)
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise UserError(f"{path}:{number}: record has no non-empty string `{key}`")
    return records
