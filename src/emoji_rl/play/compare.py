"""Paired comparisons between an evaluation's systems: which pairs are compared, mean(A - B) per pair,
mode and metric over the records both systems played with its paired bootstrap interval, and how a
line of them reads, in the terminal and in a markdown report.

Apart from the evaluation path (`play/evaluate.py`) because experiment-report compares the records
of a finished evaluation the same way: it imports these, not the path that plays the games."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict

from emoji_rl.io.jsonl import Record
from emoji_rl.io.report import markdown_table
from emoji_rl.play.intervals import paired_bootstrap, verdict

LEVEL = 0.95

Metric = Callable[[Record], float]
"""One record's value of a compared metric (its similarity, 1.0 for a won game)."""


def compare_pairs(specs: Sequence[str], systems: Collection[str]) -> list[tuple[str, str]]:
    """`A:B` pairs, each name a system; none given: each adjacent pair in `systems` order."""
    names = list(systems)
    if not specs:
        return list(zip(names[1:], names[:-1], strict=True))
    pairs = []
    for spec in specs:
        a, _, b = spec.partition(":")
        if a not in names or b not in names or a == b:
            raise ValueError(f"compare {spec!r}: use A:B, two different systems of {names}")
        pairs.append((a, b))
    return pairs


def comparisons(
    records: Sequence[Record],
    pairs: Sequence[tuple[str, str]],
    metrics: Mapping[str, Metric],
    resamples: int,
    seed: int,
) -> list[Record]:
    """mean(A - B) per pair, mode and metric over the records both systems played, with its paired
    interval; a pair with no record in common in a mode is left out."""
    by_key = {(r["system"], r["mode"], r["id"]): r for r in records}
    modes = list(dict.fromkeys(r["mode"] for r in records))
    out = []
    for a, b in pairs:
        for mode in modes:
            ids = [i for (s, m, i) in by_key if s == a and m == mode and (b, mode, i) in by_key]
            if not ids:
                continue
            for metric, value in metrics.items():
                diff = paired_bootstrap(
                    [value(by_key[a, mode, i]) for i in ids],
                    [value(by_key[b, mode, i]) for i in ids],
                    resamples,
                    seed,
                    LEVEL,
                )
                out.append({"a": a, "b": b, "mode": mode, "metric": metric, "n": len(ids), **asdict(diff)})
    return out


def format_comparisons(rows: Sequence[Record], unit: str = "message") -> str:
    """One line per comparison with an interval; `unit` is what one record is (a held-out message
    unless a game says otherwise)."""
    lines = [
        f"{r['a']} - {r['b']} ({r['mode']}, {r['n']} {unit}s) {r['metric']:<12} "
        f"{r['mean']:+.3f}  [{r['low']:+.3f}, {r['high']:+.3f}]"
        + ("" if (v := verdict(r["low"], r["high"])) == "includes 0" else f"  {v}")
        for r in rows
        if r["low"] is not None
    ]
    return "\n".join(lines)


def differences_table(rows: Sequence[Record]) -> str:
    """`comparisons`' rows as a markdown table (experiment-report's), each with what its interval says."""
    lines = []
    for r in rows:
        interval = "n/a" if r["low"] is None else f"[{r['low']:+.3f}, {r['high']:+.3f}]"
        lines.append(
            [
                f"{r['a']} − {r['b']}",
                r["mode"],
                str(r["n"]),
                r["metric"],
                f"{r['mean']:+.3f}",
                interval,
                verdict(r["low"], r["high"]),
            ]
        )
    header = ["difference", "mode", "messages", "metric", "mean", "95% paired CI", ""]
    return markdown_table(header, lines)
