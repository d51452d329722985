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

from emoji_rl.emoji.stats import compliant_emoji, most_common_share, repeat_share
from emoji_rl.errors import UserError
from emoji_rl.eval.seats_report import BOTH_SEATS, seats_sections
from emoji_rl.games.retrieval.evaluation import COMPARED, final_guess, sent_texts
from emoji_rl.io.jsonl import Record, read_jsonl, write_text
from emoji_rl.io.report import line_figure, markdown_table, number_cell
from emoji_rl.pipeline import read_marker
from emoji_rl.play.compare import comparisons, differences_table
from emoji_rl.rl.held_out import current_names

RETRIEVAL = "reports/retrieval/retrieval.json"
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
                number_cell(r["success@0.5"]),
                number_cell(r["success@0.7"]),
                number_cell(r[f"retrieval@1/{k}"]),
                number_cell(r["distinct_emoji"]),
                number_cell(r["entropy_bits"], 2),
                number_cell(r["emoji_per_message"], 2),
            ]
        )
    return markdown_table(header, rows)


def differences(retrieval: Record, cfg: Config) -> list[Record]:
    present = {r["system"] for r in retrieval["records"]}
    pairs = [spec.partition(":")[::2] for spec in cfg.compare]
    wanted = [(a, b) for a, b in pairs if a in present and b in present]
    return comparisons(retrieval["records"], wanted, COMPARED, cfg.resamples, cfg.seed)


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
