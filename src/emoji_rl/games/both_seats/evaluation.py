"""How `emoji-rl eval --game both_seats` reports both seats: each system (the base, or an adapter switched
under it) writes emoji for every held-out target and reads them back, the frozen judge reading the same
emoji, greedy by default, as GRPO plays the game (spec.py). Two modes: `pair`, every reading of the
system's own emoji, and `teacher`, the first reading of the teacher's emoji (on the records
`teacher_data` has them for; the sender and the judge as in `pair`).

Compared between systems, message by message with paired 95% bootstrap intervals: the judge's
similarity (the frozen judge reading the system's emoji: does the code stay readable to an outsider?)
and the reader's (in `pair` the system reading its own emoji; in `teacher` the system reading the
teacher's). A row adds the drift, the reader's similarity less the judge's on the same emoji, with its
interval over the messages (`pair` only: in `teacher` the two read different emoji).

    emoji-rl eval --game both_seats --data data/sft_test.jsonl --teacher_data data/sft_test.jsonl \\
        --systems base alone=runs/grpo/adapter both=runs/both/adapter --compare both:alone both:base
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from emoji_rl.config import override
from emoji_rl.decode.senders import parse_systems
from emoji_rl.errors import UserError
from emoji_rl.games.both_seats.game import TEACHER
from emoji_rl.io.jsonl import Record
from emoji_rl.play.compare import LEVEL, Metric
from emoji_rl.play.evaluation import EvalConfig, EvalOptions, EvalPlan, Evaluation, Report, game_record
from emoji_rl.play.guessing import UNKNOWN
from emoji_rl.play.intervals import bootstrap_mean
from emoji_rl.play.judge_config import greedy_judge_temperature

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.play.types import GameSetup

COMPARED: dict[str, Metric] = {
    "judge_similarity": lambda record: record["metrics"]["judge_similarity"],
    "reader_similarity": lambda record: record["metrics"]["reader_similarity"],
}


def summarize(records: Sequence[Record], cfg: EvalConfig) -> Record:
    """A system's row in one mode: the compared means, and the drift with its interval where the
    reader read the system's own emoji."""
    n = len(records)
    row: Record = {name: sum(metric(r) for r in records) / n for name, metric in COMPARED.items()}
    drifts = [r["metrics"]["drift"] for r in records if "drift" in r["metrics"]]
    if drifts:
        drift = bootstrap_mean(drifts, cfg.resamples, cfg.seed, LEVEL)
        row |= {"drift": drift.mean, "drift_lo": drift.low, "drift_hi": drift.high}
    for key in ("turns", "format_violation", "reader_cut_off"):
        row[key] = sum(r["metrics"][key] for r in records) / n
    # From the reader's last guess as logged (a reader's turn logs `guess`; the judge's, `judge_guess`),
    # which records kept before the game's own `reader_unknown` metric hold too.
    last = [next(t["guess"] for t in reversed(r["turns"]) if "guess" in t) for r in records]
    row["reader_unknown"] = sum(guess == UNKNOWN for guess in last) / n
    return row


def plan(
    cfg: EvalConfig, game: GameSetup, records: Sequence[Record], tokenizer: PreTrainedTokenizerBase
) -> EvalPlan:
    """`plain_plan`, its report with the drift and the settings the figures depend on."""
    assert EVALUATION.plan is plan
    missing = sum(TEACHER not in r for r in records)
    if "teacher" in game.games() and missing:
        # Their reader would read the system's own emoji and count in the teacher's row.
        raise UserError(
            f"mode teacher: {missing} of the {len(records)} held-out records in data={cfg.data} have no "
            f"teacher emoji in teacher_data={cfg.teacher_data}: give as teacher_data an SFT split that "
            "holds every target of data (an SFT test split holds its own), or data whose targets it holds"
        )
    plain = EVALUATION.plain_plan(cfg, game, records)
    header = {
        **plain.report.header,
        "judge": game.description,
        "reader_view": cfg.reader_view,
        "judge_weight": cfg.judge_weight,
        "teacher_data": cfg.teacher_data,
        # Each system's adapter: experiment-report finds the config of the run that trained it beside it.
        "systems": {name: path or "base" for name, path in parse_systems(cfg.systems).items()},
        "interval": f"{LEVEL:.0%} percentile bootstrap over messages, {cfg.resamples} resamples; "
        "comparisons paired (the same messages resampled for both systems)",
    }
    columns = [*plain.report.columns, "drift", "drift_lo", "drift_hi", "turns", "format_violation"]
    columns.append("reader_unknown")
    plain.report = Report(
        header,
        columns,
        ["judge_similarity", "reader_similarity", "drift"],
        plain.report.title,
        note="drift: the reader's similarity less the judge's on the same emoji (mode pair only)",
    )
    plain.score = lambda indices, episodes: [
        {"target": records[i]["target"], **game_record(e)} for i, e in zip(indices, episodes, strict=True)
    ]
    return plain


@dataclass
class Options(EvalOptions):
    """Evaluate both seats: each system as sender and reader beside the frozen judge, paired intervals."""

    data: str = override(
        EvalConfig,
        "data",
        "data/sft_test.jsonl",
        help="held-out records with `target`: an SFT split (held out from SFT and GRPO), or rl-prompts' eval split",
    )
    output_dir: str = override(EvalConfig, "output_dir", "reports/both")
    judge_temperature: float = greedy_judge_temperature()

    result_fields = (
        "model",
        "max_turns",
        "tau",
        "judge_weight",
        "teacher_data",
        "reader_view",
        "temperature",
        "max_new_tokens",
        "min_emoji",
        "max_emoji",
        "judge",
        "judge_view",
        "judge_model",
        "judge_temperature",
        "similarity_model",
        "contrast",
        "contrast_messages",
        "seed",
    )


EVALUATION = Evaluation(
    unit="message",
    compared=COMPARED,
    headline="judge_similarity",
    plan=plan,
    summarize=summarize,
    config=Options,
)
