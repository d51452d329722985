"""`emoji-rl experiment-report`: one run directory's results as a page a person reads, `DIR/report.md`.

Reads what the stages of `make experiment` wrote into the run directory:
- `reports/retrieval/retrieval.json` (`eval-retrieval`, systems base, sft, rl, teacher, random):
  the table on the held-out split, and its per-message records, from which the paired differences
  RL - SFT, SFT - base and RL - teacher are computed (whatever `--compare` that run used), and what
  each sender learned (repeated emoji, the message it sends most, the guess the judge gives most), and
  the emoji statistics of the teacher's answers to the whole split, beside which the senders' are set;
- `grpo/metrics.jsonl`: learning curves by step (reward, similarity, success, KL, distinct emoji,
  emoji per message, the contrast term, judge replies that echoed emoji), and beside them those of the
  held-out evaluation inside GRPO (`eval_steps`, from step 0 with `eval_before_train`: reward,
  similarity, success, retrieval@1);
- `sft/metrics.jsonl`: the SFT loss curves;
- `reports/*/eval_sft.json` (`eval-sft`, greedy and sampled): the SFT sender's emoji diversity beside
  its data's, where a collapse to generic emoji shows;
- `reports/both/both_seats.json` (`eval --game both_seats`, configs/cpu/experiment.both.yaml, optional):
  both seats against the sender trained alone, the three questions of docs/DESIGN.md §15 with their
  paired intervals, and the drift curve over the both-seats runs, each placed by the reader's weight in
  its sender's reward, read from the `config.yaml` its `grpo` run wrote beside its adapter;
- `stages/*.done` (the pipeline runner's markers, optional): how long each stage took.
Either evaluation may be missing, not both. Writes `report.md` beside PNGs in `DIR/report/`; every
number on the page comes from those files.

    emoji-rl experiment-report --run_dir runs/experiment
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from emoji_rl.config import read_yaml
from emoji_rl.emoji.stats import compliant_emoji, most_common_share, repeat_share
from emoji_rl.errors import UserError
from emoji_rl.games.both_seats.evaluation import COMPARED as SEATS_COMPARED
from emoji_rl.games.retrieval.evaluation import COMPARED, final_guess, sent_texts
from emoji_rl.io.jsonl import Record, read_jsonl, write_text
from emoji_rl.io.report import interval_figure, line_figure
from emoji_rl.pipeline import read_marker
from emoji_rl.play.compare import comparisons
from emoji_rl.play.intervals import verdict
from emoji_rl.rl.held_out import current_names

RETRIEVAL = "reports/retrieval/retrieval.json"
BOTH_SEATS = "reports/both/both_seats.json"
# Question (a)'s margin: both seats may cost the judge's reading this much and still count as no worse.
NO_WORSE = -0.01
GRPO_METRICS = "grpo/metrics.jsonl"
SFT_METRICS = "sft/metrics.jsonl"
# Learning curves: a panel per metric the GRPO run logged, in this order, under these titles; a
# held-out one beside its training one, so that a gap between them (overfitting the training targets)
# shows. A key ending in `*` stands for each logged key it begins, the `*` of its title for the rest:
# retrieval@1's key ends with K, the candidates it ranks among.
GRPO_CURVES = {
    "reward/mean": "reward",
    "eval/reward/mean": "held-out reward",
    "reward/group_best": "best reward in a group",
    "game/similarity": "similarity",
    "eval/similarity": "held-out similarity",
    "game/success@0.5": "success@0.5",
    "eval/success@0.5": "held-out success@0.5",
    "game/success@0.7": "success@0.7",
    "eval/success@0.7": "held-out success@0.7",
    "eval/retrieval@1/*": "held-out retrieval@1 (of *)",
    "optim/kl": "KL to the reference",
    "emoji/distinct": "distinct emoji",
    "emoji/per_message": "emoji per message",
    "reward/contrast/mean": "contrast term",
    "game/judge_emoji_stripped": "judge echoed emoji",
}
HELD_OUT_NOTE = (
    "A held-out panel is the policy as it trained, greedy on held-out messages, at the steps GRPO "
    "evaluated it (`eval_steps`; step 0: before the first update)."
)
SFT_CURVES = {"train/loss": "train loss", "eval/loss": "eval loss"}
EVAL_SFT = "reports/*/eval_sft.json"


@dataclass
class Config:
    """Write DIR/report.md from one run directory's evaluation, metrics and stage markers."""

    run_dir: str = field(default="runs/experiment", metadata={"help": "the run directory to report on"})
    compare: list[str] = field(
        default_factory=lambda: ["rl:sft", "sft:base", "rl:teacher"],
        metadata={"help": "pairs A:B shown as mean(A - B) with a paired interval (those present)"},
    )
    example_systems: list[str] = field(
        default_factory=lambda: ["base", "sft", "rl"],
        metadata={"help": "senders shown side by side on the example messages (those present)"},
    )
    examples: int = field(default=12, metadata={"help": "held-out messages shown side by side"})
    diversity_systems: list[str] = field(
        default_factory=lambda: ["sft", "rl"],
        metadata={
            "help": "senders whose emoji on the held-out split are set beside the teacher's (those present)"
        },
    )
    both_system: str = field(
        default="both", metadata={"help": "both seats' evaluation: the system trained in both seats"}
    )
    alone_system: str = field(
        default="alone", metadata={"help": "both seats' evaluation: the sender trained alone"}
    )
    base_system: str = field(
        default="base", metadata={"help": "both seats' evaluation: the base model, as a reader"}
    )
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples per interval"})
    seed: int = field(default=0, metadata={"help": "seed of the bootstrap"})

    def __post_init__(self) -> None:
        for spec in self.compare:
            a, _, b = spec.partition(":")
            if not a or not b:
                raise ValueError(f"compare {spec!r}: use A:B, two system names of eval-retrieval")


def _number(value: object, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    return "\n".join([line(header), line(["---"] * len(header)), *(line(r) for r in rows)])


def systems_table(retrieval: Record) -> str:
    """Per system and mode: the table's numbers, similarity with its 95% interval."""
    k = retrieval["distractors"]
    header = ["system", "mode", "n", "similarity [95% CI]", "success@0.5", "success@0.7"]
    header += [f"retrieval@1 (of {k})", "distinct emoji", "entropy (bits)", "emoji / message"]
    rows = []
    for r in retrieval["rows"]:
        if not r.get("n"):
            rows.append([r["system"], r["mode"], "0", *["n/a"] * (len(header) - 3)])
            continue
        interval = (
            f" [{r['similarity_lo']:.3f}, {r['similarity_hi']:.3f}]"
            if r.get("similarity_lo") is not None
            else ""
        )
        rows.append(
            [
                r["system"],
                r["mode"],
                str(r["n"]),
                f"{r['similarity']:.3f}{interval}",
                _number(r["success@0.5"]),
                _number(r["success@0.7"]),
                _number(r[f"retrieval@1/{k}"]),
                _number(r["distinct_emoji"]),
                _number(r["entropy_bits"], 2),
                _number(r["emoji_per_message"], 2),
            ]
        )
    return markdown_table(header, rows)


def differences(retrieval: Record, cfg: Config) -> list[Record]:
    present = {r["system"] for r in retrieval["records"]}
    pairs = [spec.partition(":")[::2] for spec in cfg.compare]
    wanted = [(a, b) for a, b in pairs if a in present and b in present]
    return comparisons(retrieval["records"], wanted, COMPARED, cfg.resamples, cfg.seed)


def differences_table(rows: Sequence[Record]) -> str:
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


def habits_table(retrieval: Record) -> str:
    """Per system, single-turn, what a reward hack or a collapse would show: messages that repeat an
    emoji, the one emoji message sent most often and the one guess the judge gave most often (each with
    the share of held-out messages it took), and the turns used (the system's row)."""
    header = ["system", "repeats an emoji", "most sent emoji (share)", "most given guess (share)", "turns"]
    rows = []
    for row in retrieval["rows"]:
        records = [r for r in retrieval["records"] if (r["system"], r["mode"]) == (row["system"], "single")]
        if row["mode"] != "single" or not records:
            continue
        texts, stopped = sent_texts(records)
        messages = [m for m in compliant_emoji(texts, stopped=stopped) if m is not None]
        emoji, emoji_share = most_common_share([" ".join(m) for m in messages])
        guess, guess_share = most_common_share([final_guess(r) for r in records])
        rows.append(
            [
                row["system"],
                f"{repeat_share(messages):.3f}",
                f"{emoji} ({emoji_share:.3f})" if messages else "n/a",
                f"{guess} ({guess_share:.3f})",
                f"{row['turns']:.2f}",
            ]
        )
    return markdown_table(header, rows)


def examples_table(retrieval: Record, cfg: Config) -> str:
    """The first `examples` held-out messages (in the data's order) that every shown sender played
    single-turn: per message and sender, its emoji, the judge's guess and the similarity."""
    single = {(r["system"], r["id"]): r for r in retrieval["records"] if r["mode"] == "single"}
    systems = [s for s in cfg.example_systems if any(key[0] == s for key in single)]
    ids = list(dict.fromkeys(i for _, i in single))
    shown = [i for i in ids if all((s, i) in single for s in systems)][: cfg.examples]
    rows = []
    for i in shown:
        for n, system in enumerate(systems):
            record = single[system, i]
            turn = record["turns"][0]
            guess = turn.get("guess", f"(format violation: {turn.get('violation', '')})")
            target = record["target"] if n == 0 else ""
            rows.append([target, system, turn.get("emoji", ""), guess, f"{record['similarity']:.3f}"])
    return markdown_table(["message", "sender", "emoji", "the judge's guess", "similarity"], rows)


def diversity_table(evaluations: Sequence[Record], retrieval: Record, systems: Sequence[str]) -> str:
    """Per eval-sft run, its data's answers (unless the run before had the same) and, per decoding, the
    SFT sender's replies at that run's temperature; then, where eval-retrieval had a teacher, its answers
    to the whole held-out split beside the named senders' emoji on it. Compliance and emoji statistics,
    distinct emoji and entropy also as a share of the data's."""
    header = ["replies", "n", "decoding", "T", "compliance", "emoji / message", "distinct emoji",
              "entropy (bits)", "top-10 share", "distinct / data", "entropy / data"]  # fmt: skip
    rows, shown = [], None
    for evaluation in evaluations:
        data = next(r for r in evaluation["results"] if r["system"] == "reference")
        if data != shown:
            rows.append(["data (the teacher's answers)", str(data["replies"]), "", "", *_stats(data, data)])
            shown = data
        temperature = f"{evaluation['config']['temperature']:g}"
        for row in evaluation["results"]:
            if row["system"] == "sft":
                rows.append(["sft", str(row["replies"]), row["decoding"], temperature, *_stats(row, data)])
    data = retrieval.get("teacher_emoji")
    if data:
        split = "held-out split, eval-retrieval"
        rows.append(
            [f"data (the teacher's answers; {split})", str(data["replies"]), "", "", *_stats(data, data)]
        )
        decoding = "grammar" if retrieval.get("protocol", "ours") == "ours" else "none"
        temperature = f"{retrieval.get('sender_temperature', 0.0):g}"
        for row in retrieval["rows"]:
            if row["system"] in systems and row["mode"] == "single" and row.get("n"):
                played = {**row, "compliance": 1.0 - row["violations"]}
                label = f"{row['system']} ({split})"
                rows.append([label, str(row["n"]), decoding, temperature, *_stats(played, data)])
    return markdown_table(header, rows)


def _stats(row: Record, data: Record) -> list[str]:
    return [
        f"{row['compliance']:.2f}",
        f"{row['emoji_per_message']:.2f}",
        str(row["distinct_emoji"]),
        f"{row['entropy_bits']:.2f}",
        f"{row['top10_share']:.2f}",
        f"{row['distinct_emoji'] / max(data['distinct_emoji'], 1):.2f}",
        f"{row['entropy_bits'] / data['entropy_bits']:.2f}" if data["entropy_bits"] else "n/a",
    ]


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
        cells = [_number(r.get(key)) for key in ("judge_similarity", "reader_similarity")]
        shares = [_number(r.get("turns"), 2), _number(r.get("reader_unknown"))]
        rows.append([r["system"], r["mode"], str(r["n"]), *cells, drift, *shares])
    return markdown_table(header, rows)


def drift_row(both: Record, system: str) -> Record | None:
    """`system`'s row in mode pair, where the reader read the system's own emoji (the drift's mode)."""
    rows = (r for r in both["rows"] if (r["system"], r["mode"]) == (system, "pair") and "drift" in r)
    return next(rows, None)


def seats_differences(both: Record, pairs: Sequence[tuple[str, str]], cfg: Config) -> dict[tuple, Record]:
    """mean(A - B) with its paired interval, by (A, B, mode, metric), for the pairs both played."""
    found = comparisons(both["records"], pairs, SEATS_COMPARED, cfg.resamples, cfg.seed)
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
        rows.append([f"{x:g}", system, _number(row["judge_similarity"]), against, drift])
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


def logged_keys(metrics: Sequence[Record], wanted: dict[str, str]) -> dict[str, str]:
    """`wanted` with each key ending in `*` replaced by the logged keys it begins, in the order logged."""
    logged = dict.fromkeys(key for m in metrics for key in m)
    out = {}
    for key, title in wanted.items():
        stem = key.removesuffix("*")
        if stem == key:
            out[key] = title
            continue
        out |= {k: title.replace("*", k.removeprefix(stem)) for k in logged if k.startswith(stem)}
    return out


def curves(metrics: Sequence[Record], wanted: dict[str, str]) -> dict[str, list[tuple[float, float]]]:
    """Per wanted metric that the run logged, its (step, value) points; None (non-finite) left out."""
    out = {}
    for key, title in logged_keys(metrics, wanted).items():
        points = [(float(m["step"]), float(m[key])) for m in metrics if m.get(key) is not None]
        if points:
            out[title] = points
    return out


def curve_summary(points: dict[str, list[tuple[float, float]]]) -> str:
    """First and last logged value of each curve, and its mean over the last quarter of the steps."""
    rows = []
    for title, values in points.items():
        tail = values[-max(1, len(values) // 4) :]
        rows.append(
            [
                title,
                f"{values[0][1]:.3f} (step {values[0][0]:g})",
                f"{values[-1][1]:.3f} (step {values[-1][0]:g})",
                f"{sum(v for _, v in tail) / len(tail):.3f}",
            ]
        )
    return markdown_table(["metric", "first", "last", "mean of the last quarter"], rows)


def stage_timings(run_dir: Path) -> list[Record]:
    """The pipeline runner's markers, in the order the stages finished."""
    markers = [read_marker(path) for path in sorted((run_dir / "stages").glob("*.done"))]
    return sorted(markers, key=lambda m: str(m.get("finished", "")))


def read_json(path: Path, what: str) -> Record:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: not {what} ({err})") from err


def timings_table(markers: Sequence[Record]) -> str:
    rows = [[m["name"], f"{m['seconds'] / 60:.1f}", str(m.get("finished", ""))] for m in markers]
    total = sum(m["seconds"] for m in markers)
    rows.append(["total", f"{total / 60:.1f}", ""])
    return markdown_table(["stage", "minutes", "finished"], rows)


def read_metrics(path: Path) -> list[Record]:
    """A run's metrics.jsonl (none: no lines), a run's from before #62 under today's held-out names."""
    return [current_names(row) for row in read_jsonl(path)] if path.is_file() else []


def sender_decoding(retrieval: dict) -> str:
    """How the model senders chose their emoji, from eval-retrieval's JSON."""
    temperature = retrieval.get("sender_temperature", 0.0)
    beams, scale = retrieval.get("sender_num_beams", 1), retrieval.get("sender_guidance_scale", 1.0)
    if temperature > 0:
        return f"senders sampled at T {temperature:g}"
    decoding = f"senders by beam search ({beams} beams)" if beams > 1 else "senders greedy"
    return decoding + (f", guidance scale {scale:g}" if scale != 1.0 else "")


def retrieval_sections(retrieval: Record, cfg: Config) -> list[str]:
    return [
        f"Held-out split: {retrieval['examples']} messages from `{retrieval['data']}`; judge "
        f"`{retrieval['judge']}`; protocol `{retrieval.get('protocol', 'ours')}`; {sender_decoding(retrieval)}. "
        "Two systems that played a message played it against the same distractors and the same judge; a "
        "row's n is how many messages it played, and a difference is over the messages both played.",
        "## Systems on the held-out split",
        systems_table(retrieval),
        "## Differences",
        "Mean over the messages both systems played, with a 95% paired percentile-bootstrap interval "
        f"({cfg.resamples} resamples over messages).",
        differences_table(differences(retrieval, cfg)),
    ]


def main(cfg: Config) -> None:
    run_dir = Path(cfg.run_dir)
    source, seats = run_dir / RETRIEVAL, run_dir / BOTH_SEATS
    if not source.is_file() and not seats.is_file():
        raise UserError(
            f"{source} does not exist: run `emoji-rl eval-retrieval --output_dir {source.parent}` first "
            f"(or, for the both-seats experiment alone, `emoji-rl eval --game both_seats --output_dir "
            f"{seats.parent}`)"
        )
    retrieval = read_json(source, "eval-retrieval's JSON") if source.is_file() else None
    figures = run_dir / "report"
    sections = [f"# Experiment report: {run_dir}"]
    if retrieval is not None:
        sections += retrieval_sections(retrieval, cfg)
    grpo = curves(read_metrics(run_dir / GRPO_METRICS), GRPO_CURVES)
    sft = curves(read_metrics(run_dir / SFT_METRICS), SFT_CURVES)
    sections.append("## Learning curves")
    if any(title.startswith("held-out") for title in grpo):
        sections.append(HELD_OUT_NOTE)
    for name, points, path in (("GRPO", grpo, GRPO_METRICS), ("SFT", sft, SFT_METRICS)):
        if not points:
            sections.append(f"No {name} metrics: `{run_dir / path}` is missing or empty.")
            continue
        figure = line_figure(points, f"{name} by step", figures / f"{name.lower()}_curves.png")
        sections += [f"![{name} by step]({figure.relative_to(run_dir)})", curve_summary(points)]
    evaluations = [read_json(path, "eval-sft's JSON") for path in sorted(run_dir.glob(EVAL_SFT))]
    if evaluations or (retrieval or {}).get("teacher_emoji"):
        sections += [
            "## SFT against its data",
            "The first chats of the SFT test split (eval-sft), then the whole held-out split "
            "(eval-retrieval). A collapse to generic emoji shows as fewer distinct emoji and a lower "
            "entropy than the data's: greedy decoding (T 0) sends each message's likeliest emoji, "
            "sampling at T 1 shows the distribution the sender learned.",
            diversity_table(evaluations, retrieval or {}, cfg.diversity_systems),
        ]
    if retrieval is not None:
        sections += [
            "## What the senders learned",
            "On the held-out split, single-turn. A sender that games the judge shows here: one emoji "
            "message for many targets, or one guess the judge gives whatever it is sent.",
            habits_table(retrieval),
            "## Held-out messages, side by side",
            "Single-turn: each sender's emoji and what the judge guessed from them.",
            examples_table(retrieval, cfg),
        ]
    if seats.is_file():
        sections += seats_sections(read_json(seats, "eval --game both_seats' JSON"), cfg, run_dir)
    markers = stage_timings(run_dir)
    if markers:
        sections += ["## Stage timings", timings_table(markers)]
    if retrieval is not None and retrieval.get("caveat"):
        sections += ["## Caveat", retrieval["caveat"]]
    report = run_dir / "report.md"
    write_text(report, "\n\n".join(sections) + "\n")
    print(f"report: {report}")
