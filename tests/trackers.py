"""What wandb and trackio hold after a run, read back from their own files: wandb's offline run files
(the transaction log of protobuf records that `wandb sync` uploads) and trackio's local database."""

from __future__ import annotations

import json
import struct
from pathlib import Path

# The .wandb file: a 7-byte header (":W&B", a magic number, a version), then LevelDB's log format,
# which wandb's Go core writes and no longer has a Python reader for: 32 KiB blocks of chunks, each a
# CRC32, a length, a type (full, first, middle, last); a block's tail under 7 bytes is padding.
_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    ident, _magic, _version = _HEADER.unpack_from(data)
    assert ident == b":W&B", f"{path} is not a wandb run file"
    records, pending, pos = [], b"", _HEADER.size
    while pos + _CHUNK.size <= len(data):
        room = _BLOCK - pos % _BLOCK
        if room < _CHUNK.size:
            pos += room
            continue
        _crc, length, kind = _CHUNK.unpack_from(data, pos)
        if kind == 0:  # a block's zero padding
            pos += room
            continue
        pending += data[pos + _CHUNK.size : pos + _CHUNK.size + length]
        pos += _CHUNK.size + length
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_runs(wandb_dir: Path) -> list[tuple[str, list[dict]]]:
    """Each offline run wandb wrote under `wandb_dir`, oldest first: its run id and its history rows
    (`_step` and the logged values)."""
    runs = []
    for path in sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb")):
        run_id, rows = None, []
        for record in _records(path):
            if record.HasField("run"):
                run_id = record.run.run_id
            if record.HasField("history"):
                row = {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                rows.append(row)
        runs.append((run_id, rows))
    return runs


def trackio_rows(project: str, name: str) -> list[dict]:
    """The metric rows of trackio run `name` in its local store ($TRACKIO_DIR): `step` and the values."""
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, name)
