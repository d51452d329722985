"""experiment-report's both-seats section (docs/DESIGN.md §15, issue #61), from the JSON that
`eval --game both_seats` wrote in the run directory: each system's row, the three questions with
their paired intervals and answers, and the drift curve over the runs trained in both seats, each
placed by the reader's weight in its sender's reward (1 - judge_weight), read from the `config.yaml`
its `grpo` run wrote beside its adapter (the evaluation's JSON names each system's adapter, `systems`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from emoji_rl.config import read_yaml
from emoji_rl.games.both_seats.evaluation import COMPARED
from emoji_rl.io.jsonl import Record
from emoji_rl.io.report import interval_figure, markdown_table, number_cell
from emoji_rl.play.compare import comparisons

BOTH_SEATS = "reports/both/both_seats.json"
# Question (a)'s margin: both seats may cost the judge's reading this much and still count as no worse.
NO_WORSE = -0.01


class Config(Protocol):
    """What the section reads of experiment-report's Config: the systems the questions name, and the
    bootstrap's settings."""

    both_system: str
    alone_system: str
    base_system: str
    resamples: int
    seed: int


def _interval(mean: float, low: float | None, high: float | None) -> str:
    return f"{mean:+.3f}" if low is None or high is None else f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]"


def seats_table(both: Record) -> str:
    """Per system and mode: the judge's and the reader's similarity, the drift with its interval, and
    the share of games whose reader ended on `[unknown]` (it wrote no words: nothing to read or learn)."""
    header = ["system", "mode", "n", "judge similarity", "reader similarity", "drift [95% CI]", "turns"]
    header.append("reader [unknown]")
    rows = []
    for r in both["rows"]:
        drift = "n/a" if r.get("drift") is None else _interval(r["drift"], r["drift_lo"], r["drift_hi"])
        cells = [number_cell(r.get(key)) for key in ("judge_similarity", "reader_similarity")]
        shares = [number_cell(r.get("turns"), 2), number_cell(r.get("reader_unknown"))]
        rows.append([r["system"], r["mode"], str(r["n"]), *cells, drift, *shares])
    return markdown_table(header, rows)


def drift_row(both: Record, system: str) -> Record | None:
    """`system`'s row in mode pair, where the reader read the system's own emoji (the drift's mode)."""
    rows = (r for r in both["rows"] if (r["system"], r["mode"]) == (system, "pair") and "drift" in r)
    return next(rows, None)


def seats_differences(both: Record, pairs: Sequence[tuple[str, str]], cfg: Config) -> dict[tuple, Record]:
    """mean(A - B) with its paired interval, by (A, B, mode, metric), for the pairs both played."""
    found = comparisons(both["records"], pairs, COMPARED, cfg.resamples, cfg.seed)
    return {(d["a"], d["b"], d["mode"], d["metric"]): d for d in found}


def questions_table(both: Record, cfg: Config) -> str:
    """docs/DESIGN.md §15's three questions: the measure each reads, its interval, and the answer."""
    one, alone, base = cfg.both_system, cfg.alone_system, cfg.base_system
    diffs = seats_differences(both, [(one, alone), (one, base)], cfg)
    row = drift_row(both, one)
    drift = row and {"mean": row["drift"], "low": row["drift_lo"], "high": row["drift_hi"], "n": row["n"]}
    asked = [
        ("(a) the judge reads both seats' emoji no worse than alone's", f"{one} − {alone}, pair, judge similarity",
         diffs.get((one, alone, "pair", "judge_similarity")), NO_WORSE),
        ("(b) the pair reads its own emoji better than the judge", f"{one}, pair, drift (reader − judge)",
         drift, 0.0),
        ("(c) it reads the teacher's emoji better than the base model", f"{one} − {base}, teacher, reader similarity",
         diffs.get((one, base, "teacher", "reader_similarity")), 0.0),
    ]  # fmt: skip
    rows = []
    for question, measure, found, bound in asked:
        if not found:
            rows.append([question, measure, "0", "n/a", "n/a", "n/a: not evaluated"])
            continue
        low = found["low"]
        interval = "n/a" if low is None else f"[{low:+.3f}, {found['high']:+.3f}]"
        if low is None:
            answer = "n/a: no interval"
        else:  # the low end to four places: at three it may print as the bound itself
            answer = f"{'yes' if low > bound else 'no'}: low end {low:+.4f}, bound {bound:+.2f}"
        rows.append([question, measure, str(found["n"]), f"{found['mean']:+.3f}", interval, answer])
    return markdown_table(["question", "measure", "messages", "mean", "95% CI", "answer"], rows)


def reader_weights(both: Record) -> dict[str, float]:
    """Per system played from an adapter that `grpo --game both_seats` trained, the reader's weight in
    its sender's reward (1 - judge_weight), from the config.yaml the run wrote beside the adapter."""
    weights = {}
    for name, path in both.get("systems", {}).items():
        config = Path(path).parent / "config.yaml"
        if not Path(path).is_dir() or not config.is_file():
            continue
        trained = read_yaml(config) or {}
        if trained.get("game") == "both_seats" and "judge_weight" in trained:
            weights[name] = 1.0 - float(trained["judge_weight"])
    return weights


def drift_curve(both: Record, cfg: Config, path: Path) -> tuple[str, Path] | None:
    """The both-seats runs by the reader's weight: question (a)'s difference against the sender alone,
    and the drift, with their intervals; a table and a figure (None: fewer than two such runs)."""
    weights = reader_weights(both)
    systems = sorted((s for s in weights if drift_row(both, s)), key=lambda s: weights[s])
    if len(systems) < 2:
        return None
    diffs = seats_differences(both, [(s, cfg.alone_system) for s in systems], cfg)
    judged, drifted, rows = [], [], []
    for system in systems:
        x, row = weights[system], drift_row(both, system)
        assert row is not None
        drifted.append((x, row["drift"], row["drift_lo"], row["drift_hi"]))
        diff = diffs.get((system, cfg.alone_system, "pair", "judge_similarity"))
        if diff is not None:
            judged.append((x, diff["mean"], diff["low"], diff["high"]))
        against = "n/a" if diff is None else _interval(diff["mean"], diff["low"], diff["high"])
        drift = _interval(row["drift"], row["drift_lo"], row["drift_hi"])
        rows.append([f"{x:g}", system, number_cell(row["judge_similarity"]), against, drift])
    header = ["reader's weight", "system", "judge similarity", f"− {cfg.alone_system} [95% CI]"]
    header.append("drift [95% CI]")
    panels = {f"judge similarity − {cfg.alone_system}": judged, "drift (reader − judge)": drifted}
    figure = interval_figure(
        {title: points for title, points in panels.items() if points},
        "both seats by the reader's weight in the sender's reward (mode pair)",
        path,
        xlabel="reader's weight (1 − judge_weight)",
    )
    return markdown_table(header, rows), figure


def seats_sections(both: Record, cfg: Config, run_dir: Path) -> list[str]:
    sections = [
        "## Both seats",
        f"{both['examples']} held-out messages from `{both['data']}`; judge `{both['judge']}`; the reader "
        f"shown `{both['reader_view']}`. Mode `pair`: each system reads its own emoji beside the frozen "
        "judge; mode `teacher`: it reads the teacher's. The drift is the reader's similarity less the "
        "judge's on the same emoji.",
        seats_table(both),
        "### The questions",
        f"Paired 95% percentile-bootstrap intervals over messages ({cfg.resamples} resamples); the drift's "
        "is the evaluation's own, over the system's messages.",
        questions_table(both, cfg),
    ]
    curve = drift_curve(both, cfg, run_dir / "report" / "drift_curve.png")
    if curve is not None:
        table, figure = curve
        sections += [
            "### The drift curve",
            "Each run trained in both seats, placed by the reader's weight in its sender's reward (from "
            "the config.yaml beside its adapter).",
            f"![the drift curve]({figure.relative_to(run_dir)})",
            table,
        ]
    return sections
