"""One line of `make bench` (what was measured, against what, the ratio and its goal), the table of
them, and the command line every bench module shares."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    measured: str
    baseline: str
    ratio: float
    goal: str
    met: bool | None
    """None: a figure reported without a goal to meet (printed as -)."""


def print_rows(rows: list[Row]) -> None:
    width = max(len(r.name) for r in rows)
    print(f"{'benchmark':<{width}}  {'measured':>14}  {'baseline':>14}  {'ratio':>7}  {'goal':>8}  met")
    for r in rows:
        print(
            f"{r.name:<{width}}  {r.measured:>14}  {r.baseline:>14}  {r.ratio:>6.2f}x  {r.goal:>8}  "
            f"{'-' if r.met is None else 'yes' if r.met else 'NO'}"
        )


def run_benchmarks(
    benchmarks: dict[str, Callable[[], list[Row]]], prog: str, description: str, argv: list[str] | None
) -> None:
    """The command line of a bench module: run its benchmarks (or `--only` some), then the table."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--only", nargs="+", choices=list(benchmarks), help="run only these benchmarks")
    args = parser.parse_args(argv)
    rows: list[Row] = []
    for name in args.only or benchmarks:
        print(f"running {name} ...", flush=True)
        rows.extend(benchmarks[name]())
    print()
    print_rows(rows)
