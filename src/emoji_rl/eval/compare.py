"""eval-retrieval's comparisons: which pairs of systems are compared, mean(A - B) per pair, mode and
metric over the messages both played with its paired bootstrap interval, and how a line of them
reads; with the per-message reads of a record (its final guess, what each turn sent).

Apart from the stage (`eval/retrieval.py`) because experiment-report reads the same records and
compares them the same way: it imports these, not the stage that plays the games."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING

from emoji_rl.eval.intervals import paired_bootstrap, verdict
from emoji_rl.io.jsonl import Record

if TYPE_CHECKING:
    from emoji_rl.decode.senders import System

COMPARED = ("similarity", "success@0.5", "success@0.7", "retrieval@1")
LEVEL = 0.95


def compare_pairs(specs: Sequence[str], systems: dict[str, System]) -> list[tuple[str, str]]:
    """`A:B` pairs, each name a system; none given: each adjacent pair in `systems` order."""
    names = list(systems)
    if not specs:
        return list(zip(names[1:], names[:-1], strict=True))
    pairs = []
    for spec in specs:
        a, _, b = spec.partition(":")
        if a not in systems or b not in systems or a == b:
            raise ValueError(f"compare {spec!r}: use A:B, two different systems of {names}")
        pairs.append((a, b))
    return pairs


def final_guess(record: Record) -> str:
    return next((t["guess"] for t in reversed(record["turns"]) if "guess" in t), "[unknown]")


def sent_texts(records: Sequence[Record]) -> tuple[list[str], list[bool]]:
    """Every turn's message and whether the game took it: a turn it refused (cut off by the token
    budget, or no emoji message) counts for no emoji, whatever its text."""
    turns = [t for r in records for t in r["turns"]]
    return [t.get("emoji", "") for t in turns], ["violation" not in t for t in turns]


def comparisons(
    records: Sequence[Record], pairs: Sequence[tuple[str, str]], resamples: int, seed: int
) -> list[Record]:
    """mean(A - B) per pair, mode and compared metric over the messages both systems played, with
    its paired interval; a pair with no message in common in a mode is left out."""
    by_key = {(r["system"], r["mode"], r["id"]): r for r in records}
    modes = list(dict.fromkeys(r["mode"] for r in records))
    out = []
    for a, b in pairs:
        for mode in modes:
            ids = [i for (s, m, i) in by_key if s == a and m == mode and (b, mode, i) in by_key]
            if not ids:
                continue
            for metric in COMPARED:
                value = metric_of(metric)
                diff = paired_bootstrap(
                    [value(by_key[a, mode, i]) for i in ids],
                    [value(by_key[b, mode, i]) for i in ids],
                    resamples,
                    seed,
                    LEVEL,
                )
                out.append({"a": a, "b": b, "mode": mode, "metric": metric, "n": len(ids), **asdict(diff)})
    return out


def metric_of(metric: str):
    """A per-message value of a compared metric: the similarity, or as 0/1 success at a threshold or
    whether the guess picked out its target (retrieval@1)."""
    if metric == "similarity":
        return lambda r: r["similarity"]
    if metric == "retrieval@1":
        return lambda r: float(r["retrieved"])
    threshold = float(metric.removeprefix("success@"))
    return lambda r: float(r["similarity"] >= threshold)


def format_comparisons(rows: Sequence[Record]) -> str:
    lines = [
        f"{r['a']} - {r['b']} ({r['mode']}, {r['n']} messages) {r['metric']:<12} "
        f"{r['mean']:+.3f}  [{r['low']:+.3f}, {r['high']:+.3f}]"
        + ("" if (v := verdict(r["low"], r["high"])) == "includes 0" else f"  {v}")
        for r in rows
        if r["low"] is not None
    ]
    return "\n".join(lines)
