"""`emoji-rl eval-human`: what people played in `emoji-rl play-web`, reported per sender.

Guess mode's answers are the human evaluation: a person, not the model judge, reconstructs the
message from a sender's emoji, scored by the training scorer (MiniLM similarity). Per sender and
mode, with 95% percentile-bootstrap intervals over rounds: mean similarity and success@0.5 / 0.7;
beside them, the model judge's similarity on the same emoji and the agreement between the two
(Pearson r over rounds): how far the judge-based figures of `eval-retrieval` stand for people.
`single` is every round's first turn, `multi` its last answered turn, as in `eval-retrieval`'s table.

`--compare A:B` sets two senders side by side (the sender trained in both seats against the one
trained alone: issue #61): per mode, over the targets people were shown both senders' emoji for, the
mean of each target's similarity under A less under B, with a paired bootstrap interval over those
targets (blind and balanced assignment gives each sender each target in turn, so the pairs fill in
as people play).

Send mode swaps the roles: people write the emoji and the model judge guesses. Its table is the
leaderboard's: the judge's similarity on first turns, each person's and all people's beside each
model sender's (on the rounds people answered in guess mode), with the same intervals.
Writes both tables, `human.json`, `human.png` and `human_send.png` to `output_dir`.

    emoji-rl eval-human --db runs/play-web/answers.db
    emoji-rl eval-human --db runs/play-web/answers.db --compare both:alone
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import Record, write_json
from emoji_rl.io.report import bar_figure, format_table
from emoji_rl.play.intervals import bootstrap_mean, paired_bootstrap, verdict
from emoji_rl.web.store import Store, judge_scores_by_sender

THRESHOLDS = (0.5, 0.7)
LEVEL = 0.95
METRICS = ("similarity", *[f"success@{t}" for t in THRESHOLDS])
SCORE_COLUMNS = [column for name in METRICS for column in (name, f"{name}_lo", f"{name}_hi")]
ALL_PEOPLE = "all people"


@dataclass
class Config:
    """Report on what people played in play-web: per sender, with 95% bootstrap intervals."""

    db: str = field(default="runs/play-web/answers.db", metadata={"help": "play-web's SQLite file"})
    output_dir: str = field(default="reports/human", metadata={"help": "where the JSON and PNG go"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples per interval"})
    seed: int = field(default=0, metadata={"help": "seed of the bootstrap"})
    compare: list[str] = field(
        default_factory=list,
        metadata={
            "help": "sender pairs A:B (play-web's system names): people's similarity under A less under B, "
            "paired by target, with its interval; none: no comparison"
        },
    )

    def __post_init__(self) -> None:
        if self.resamples < 100:
            raise ValueError(f"resamples={self.resamples}: use at least 100 for a 95% interval")
        for pair in self.compare:
            a, sep, b = pair.partition(":")
            if not (sep and a and b and a != b):
                raise ValueError(f"compare {pair!r}: write two different senders as A:B (e.g. both:alone)")


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson correlation; None for fewer than three pairs or a constant side (undefined)."""
    if len(xs) < 3 or np.std(xs) == 0 or np.std(ys) == 0:
        return None
    return float(np.corrcoef(xs, ys)[0, 1])


def rounds_by_mode(answers: Sequence[Record]) -> dict[str, list[Record]]:
    """Guess-mode answers as one record per round: its first turn (`single`), its last (`multi`)."""
    by_round: dict[str, list[Record]] = {}
    for a in answers:
        by_round.setdefault(a["round_id"], []).append(a)
    turns = [sorted(rows, key=lambda r: r["turn"]) for rows in by_round.values()]
    return {
        "single": [rows[0] for rows in turns if rows[0]["turn"] == 1],
        "multi": [rows[-1] for rows in turns],
    }


def score_row(similarities: Sequence[float], resamples: int, seed: int) -> dict[str, float | int | None]:
    """Rounds, mean similarity and success@t of one sender's rounds, each mean with its interval."""
    row: dict[str, float | int | None] = {"rounds": len(similarities)}
    series = {
        "similarity": similarities,
        **{f"success@{t}": [float(s >= t) for s in similarities] for t in THRESHOLDS},
    }
    for name, values in series.items():
        interval = bootstrap_mean(values, resamples, seed, LEVEL)
        row[name], row[f"{name}_lo"], row[f"{name}_hi"] = interval.mean, interval.low, interval.high
    return row


def summarize(rounds: Sequence[Record], resamples: int, seed: int) -> dict[str, float | int | None]:
    human = [r["similarity"] for r in rounds]
    judge = [r["judge_similarity"] for r in rounds]
    row = score_row(human, resamples, seed)
    row["judge_similarity"] = sum(judge) / len(judge)
    row["agreement_r"] = pearson(judge, human)
    return row


def send_rows(answers: Sequence[Record], resamples: int, seed: int) -> list[Record]:
    """Send mode's table: the judge's similarity on the first turns of the model senders, of all
    people together, then of each person (`kind`: model, people, person)."""
    by_sender = judge_scores_by_sender(answers)
    people = [s for (kind, _), values in by_sender.items() if kind == "person" for s in values]
    groups = [
        *((("model", name), values) for (kind, name), values in by_sender.items() if kind == "model"),
        *([(("people", ALL_PEOPLE), people)] if people else []),
        *((("person", name), values) for (kind, name), values in by_sender.items() if kind == "person"),
    ]
    return [
        {"system": name, "kind": kind, "mode": "send", **score_row(values, resamples, seed)}
        for (kind, name), values in groups
    ]


def guess_rows(answers: Sequence[Record], resamples: int, seed: int) -> list[Record]:
    """Guess mode's table: per mode (single, multi) and sender, people's similarity and the judge's."""
    senders = list(dict.fromkeys(a["sender"] for a in answers))
    rows = []
    for mode, rounds in rounds_by_mode(answers).items():
        for sender in senders:
            mine = [r for r in rounds if r["sender"] == sender]
            if mine:
                rows.append({"system": sender, "mode": mode, **summarize(mine, resamples, seed)})
    return rows


def sender_comparisons(
    answers: Sequence[Record], pairs: Sequence[str], resamples: int, seed: int
) -> list[Record]:
    """Per pair A:B and mode, people's similarity under A less under B, paired by target: each target
    both senders were played on counts once, its rounds of each sender averaged."""
    comparisons = []
    for mode, rounds in rounds_by_mode(answers).items():
        by_target: dict[tuple[str, str], list[float]] = {}
        for r in rounds:
            by_target.setdefault((r["sender"], r["target_id"]), []).append(r["similarity"])
        for pair in pairs:
            a, _, b = pair.partition(":")
            targets = sorted({t for s, t in by_target if s == a} & {t for s, t in by_target if s == b})
            row: Record = {"a": a, "b": b, "mode": mode, "metric": "similarity", "targets": len(targets)}
            if targets:
                means = [[float(np.mean(by_target[sender, t])) for t in targets] for sender in (a, b)]
                interval = paired_bootstrap(*means, resamples, seed, LEVEL)
                row |= {"mean": interval.mean, "low": interval.low, "high": interval.high}
                row["verdict"] = verdict(interval.low, interval.high)
            comparisons.append(row)
    return comparisons


def main(cfg: Config) -> None:
    if not Path(cfg.db).is_file():
        raise UserError(f"db {cfg.db} does not exist: people play with `emoji-rl play-web` (make play-web)")
    answers = Store(cfg.db).answers()
    if not answers:
        raise UserError(f"{cfg.db} holds no answers yet: play some with `emoji-rl play-web`")
    guessed = [a for a in answers if a["mode"] == "guess"]
    sent = [a for a in answers if a["mode"] == "send"]
    rows = guess_rows(guessed, cfg.resamples, cfg.seed)
    board = send_rows(answers, cfg.resamples, cfg.seed)
    comparisons = sender_comparisons(guessed, cfg.compare, cfg.resamples, cfg.seed)
    everyone = [r for rows_ in rounds_by_mode(guessed).values() for r in rows_]
    overall_r = pearson([r["judge_similarity"] for r in everyone], [r["similarity"] for r in everyone])
    out = Path(cfg.output_dir)
    write_json(
        out / "human.json",
        {
            "db": cfg.db,
            "answers": {"guess": len(guessed), "send": len(sent)},
            "interval": f"{LEVEL:.0%} percentile bootstrap over rounds, {cfg.resamples} resamples",
            "agreement_r_all": overall_r,
            "rows": rows,
            "comparisons": comparisons,
            "send_rows": board,
        },
    )
    print(f"\n{len(guessed)} guess-mode and {len(sent)} send-mode answers from {cfg.db}")
    if rows:
        figure = bar_figure(
            rows,
            [*METRICS, "judge_similarity"],
            group="mode",
            series="system",
            title="people guessing the senders' emoji (play-web)",
            path=out / "human.png",
        )
        agreement = "-" if overall_r is None else f"{overall_r:.3f}"
        print(f"\nguess mode: people guess; judge-human agreement (Pearson r, all rounds): {agreement}")
        print(
            format_table(
                rows, ["system", "mode", "rounds", *SCORE_COLUMNS, "judge_similarity", "agreement_r"]
            )
        )
        print(f"plot: {figure}")
    if comparisons:
        print("\npeople's similarity, A - B over the targets both were played on (paired by target):")
        print(format_table(comparisons, ["a", "b", "mode", "targets", "mean", "low", "high", "verdict"]))
    if sent:
        figure = bar_figure(
            [r for r in board if r["kind"] != "person"],
            METRICS,
            group="mode",
            series="system",
            title="the model judge guessing people's and the senders' emoji (play-web)",
            path=out / "human_send.png",
        )
        print("\nsend mode: the model judge guesses first turns, people's beside the model senders'")
        print(format_table(board, ["system", "kind", "rounds", *SCORE_COLUMNS]))
        print(f"plot: {figure}")
    print(f"\nreport: {out / 'human.json'}")
