"""What an evaluation keeps of each game it played, and when a rerun may trust it: the log the records
are appended to as each batch of games ends (`NAME_records.jsonl`), headed by the fingerprint of what
they depend on, so a rerun plays only the games it lacks and one of another config is refused; which
records a system plays, cut into the batches a whole run cuts, and each batch's seed.

Apart from the path (`play/evaluate.py`), which plays the games and writes the report: this is what
a game leaves on disk. A record is keyed by (system, mode, id); its other fields are the game's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from emoji_rl.errors import DataError, UserError
from emoji_rl.io.jsonl import AppendLog, Record
from emoji_rl.lm.adapters import adapter_hash, require_adapter

if TYPE_CHECKING:
    from emoji_rl.decode.senders import System
    from emoji_rl.play.evaluation import Scripted


def record_ids(records: Sequence[Record], path: str) -> list[str]:
    """Each record's id (its index where it has none): records, the log and comparisons are keyed by
    it, so two records may not share one."""
    ids = [str(r.get("id", i)) for i, r in enumerate(records)]
    first: dict[str, int] = {}
    for number, record in enumerate(ids, 1):
        if first.setdefault(record, number) != number:
            raise DataError(path, number, f"id {record!r} again (first on line {first[record]})")
    return ids


def sha256(value: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()[:16]


def fingerprint(data: object, systems: Mapping[str, str], settings: Record) -> Record:
    """What a game's record depends on besides its system, mode and record: the held-out data (a
    game may draw on the other records, as distractors), what each system is
    (`system_fingerprint`) and the config's settings that change a game (`EvalConfig.result_fields`)."""
    return {"data": sha256(data), "systems": dict(systems), **settings}


def system_fingerprint(system: System | Scripted, answers: Sequence[object] | None) -> str:
    """What a system is: an adapter's files (not its path: a stage rerun retrains into the same
    directory), the base model, or a scripted system's answers."""
    if system.kind == "adapter":
        assert system.path is not None
        # Checked here, before the log keeps this hash, and not only when the adapters load.
        require_adapter(system.name, system.path)
        return f"adapter sha256:{str(adapter_hash(system.path))[:16]}"
    return "base" if answers is None else f"answers {sha256(answers)}"


def _flat(config: Record) -> Record:
    systems = {f"system {name}": spec for name, spec in config["systems"].items()}
    return {**{k: v for k, v in config.items() if k != "systems"}, **systems}


def logged_records(log: AppendLog, fingerprint: Record) -> dict[tuple[str, str, str], Record]:
    """The records in `log` by (system, mode, id), if the config lines that head its runs agree with
    `fingerprint`: each key equal, and each system in both the same (a system only one side has is
    fine). A run that brings a system of its own logs its config, so later runs check that one too."""
    config = json.loads(json.dumps(fingerprint))  # as the log holds it
    heads = [r["config"] for r in log.records if "config" in r]
    records = [r for r in log.records if "config" not in r]
    if records and not heads:
        raise UserError(
            f"{log.path} holds records but not the config that made them: delete it to start over, "
            "or choose another --output_dir"
        )
    stored = {k: v for head in heads for k, v in _flat(head).items()}
    current = _flat(config)
    for key in dict.fromkeys([*current, *stored]) if stored else ():
        one_sided = key.startswith("system ") and (key not in current or key not in stored)
        if current.get(key) != stored.get(key) and not one_sided:
            raise UserError(
                f"{log.path} holds the records of another config: {key} is {stored.get(key)!r} there and "
                f"{current.get(key)!r} here. Delete {log.path} to start over, or choose another --output_dir"
            )
    if current.keys() - stored.keys():
        log.append({"config": config})
    return {(r["system"], r["mode"], r["id"]): r for r in records}


def played_indices(
    system: System | Scripted, answers: Sequence[object] | None, n: int, reference: int
) -> list[int]:
    """The records a system plays: all `n`, or the first `reference` for a system without an adapter
    of its own (base, a scripted one) when `reference` > 0, and of those only the ones a scripted
    system has an answer for."""
    limit = min(n, reference) if reference and system.kind != "adapter" else n
    return [i for i in range(limit) if answers is None or answers[i] is not None]


def unplayed_batches(indices: Sequence[int], batch_size: int, done: set[int]) -> list[list[int]]:
    """The batches of `indices` with a game not logged yet, cut as a whole run cuts them: a batch's
    draws follow from its first record (`batch_seed`), so one that a crash cut short is replayed whole
    and draws as it did."""
    batches = [list(indices[k : k + batch_size]) for k in range(0, len(indices), batch_size)]
    return [batch for batch in batches if not done.issuperset(batch)]


def batch_seed(seed: int, first: int) -> int:
    """Torch's seed for the batch that starts at record `first`. The same for every system and mode,
    so a sampled partner or policy differs by its inputs only; and not carried over from the batch
    before, so a rerun that plays only the missing batches draws as a whole run does."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{first}".encode()).digest()[:8], "little")
