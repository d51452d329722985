"""wandb's offline run files read back: what a killed run's wandb process wrote before it died.

A `.wandb` file is a 7-byte header (":W&B", a magic number, a version), then LevelDB's log format,
which wandb's Go core writes and no longer has a Python reader for: 32 KiB blocks of chunks, each a
CRC32, a length, a type (full, first, middle, last); a block's tail under 7 bytes is padding. Each
record is a protobuf of wandb's own `Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _LAST = 1, 4


def records(path: Path) -> list:
    """The whole records of one `.wandb` file, in order; a record cut short by a kill is left out."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    if len(data) < _HEADER.size or _HEADER.unpack_from(data)[0] != b":W&B":
        return []  # a file killed before its header was whole holds nothing
    found, pending, pos = [], b"", _HEADER.size
    while pos + _CHUNK.size <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK.size:
            pos += room
            continue
        _crc, length, kind = _CHUNK.unpack_from(data, pos)
        if kind == 0:  # a block's zero padding
            pos += room
            continue
        if pos + _CHUNK.size + length > len(data):
            break
        pending += data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        pos += _CHUNK.size + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
            pending = b""
    return found


def history(path: Path) -> tuple[str | None, list[dict]]:
    """One offline run file's run id and its history rows (`_step` and the logged values)."""
    run_id, rows = None, []
    for record in records(path):
        if record.HasField("run"):
            run_id = record.run.run_id
        if record.HasField("history"):
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return run_id, rows


def offline_files(wandb_dir: str | Path, run_id: str) -> list[Path]:
    """The offline files of wandb run `run_id` under `wandb_dir`, oldest first (one per process that
    logged to it)."""
    return sorted(Path(wandb_dir).glob(f"wandb/offline-run-*-{run_id}/run-{run_id}.wandb"))


def offline_last_step(wandb_dir: str | Path, run_id: str, exclude: Path | None = None) -> int:
    """The last `_step` that the offline files of `run_id` hold (-1: none), `exclude`'s folder aside."""
    steps = [
        row["_step"]
        for path in offline_files(wandb_dir, run_id)
        if exclude is None or path.parent != exclude
        for row in history(path)[1]
        if "_step" in row
    ]
    return max(steps, default=-1)
