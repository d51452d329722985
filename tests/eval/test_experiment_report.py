"""experiment-report on a small synthetic run directory: every number on the page is from its files."""

from __future__ import annotations

import json

import pytest

from emoji_rl import cli
from emoji_rl.errors import UserError

TARGETS = ["let's get pizza tonight", "the train is late", "happy birthday sis", "I lost my keys"]
# Per system, the final similarity on each message: SFT beats base by exactly 0.1 on every message,
# RL beats SFT by 0.2 on two messages and ties on two, the teacher scores 0.5 everywhere.
SIMILARITIES = {
    "base": [0.1, 0.2, 0.3, 0.4],
    "sft": [0.2, 0.3, 0.4, 0.5],
    "rl": [0.4, 0.3, 0.6, 0.5],
    "teacher": [0.5, 0.5, 0.5, 0.5],
}
EMOJI = {"base": "😀 😀", "sft": "🍕 🌙", "rl": "🍕 🍕 🌙", "teacher": "🍕 🌃"}
# The judge gives RL one stock guess for three of the four messages.
GUESSES = {("rl", i): "I'm a student" for i in (1, 2, 3)}


def _row(system, mode, sims, **extra):
    n = len(sims)
    return {
        "system": system,
        "mode": mode,
        "n": n,
        "similarity": sum(sims) / n,
        "similarity_lo": min(sims),
        "similarity_hi": max(sims),
        "success@0.5": sum(s >= 0.5 for s in sims) / n,
        "success@0.65": 0.0,
        "success@0.7": sum(s >= 0.7 for s in sims) / n,
        "success@0.85": 0.0,
        "turns": 1.0,
        "violations": 0.0,
        "retrieval@1/3": 0.75,
        "emoji_per_message": 2.5,
        "distinct_emoji": 7,
        "entropy_bits": 2.5,
        "top10_share": 1.0,
        **extra,
    }


def _record(system, i):
    return {
        "system": system,
        "mode": "single",
        "id": f"m{i}",
        "target": TARGETS[i],
        "turns": [{"emoji": EMOJI[system], "guess": GUESSES.get((system, i), f"{system} guess {i}")}],
        "similarity": SIMILARITIES[system][i],
        "violation": False,
        "retrieved": True,
    }


def table_under(lines, header):
    """The rows of the markdown table whose header line is `header`, to the blank line after it."""
    start = lines.index(header) + 2  # the header, then its --- line
    return lines[start : lines.index("", start)]


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "experiment"
    retrieval = {
        "protocol": "ours",
        "sender_temperature": 0.0,
        "sender_num_beams": 8,
        "judge": "hf(embedded:smollm2, view=gloss, T=0)",
        "data": "runs/experiment/data/rl_eval.jsonl",
        "examples": 4,
        "distractors": 3,
        "rows": [
            *(_row(s, "single", sims) for s, sims in SIMILARITIES.items()),
            {"system": "teacher", "mode": "multi", "n": 0, "note": "n/a: one fixed message per target"},
        ],
        "comparisons": [],
        "records": [_record(s, i) for s in SIMILARITIES for i in range(4)],
        "caveat": "the gloss view reads emoji names",
    }
    (run / "reports" / "retrieval").mkdir(parents=True)
    (run / "reports" / "retrieval" / "retrieval.json").write_text(json.dumps(retrieval))
    (run / "grpo").mkdir()
    steps = [
        {"step": s, "reward/mean": r, "game/similarity": sim, "game/success@0.7": 0.0, "optim/kl": kl}
        for s, r, sim, kl in [
            (1, -0.2, 0.20, 0.0),
            (2, 0.1, 0.25, 0.01),
            (3, 0.3, 0.31, None),
            (4, 0.4, 0.35, 0.03),
        ]
    ]
    (run / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    (run / "sft").mkdir()
    (run / "sft" / "metrics.jsonl").write_text(
        json.dumps({"step": 10, "train/loss": 2.0})
        + "\n"
        + json.dumps({"step": 20, "train/loss": 1.5})
        + "\n"
    )
    (run / "stages").mkdir()
    for name, seconds, finished in [
        ("sft", 600.0, "2026-11-25T02:10:00"),
        ("prompts", 30.0, "2026-11-25T02:00:00"),
    ]:
        marker = {"name": name, "command": ["emoji-rl", name], "seconds": seconds, "finished": finished}
        (run / "stages" / f"{name}.done").write_text(json.dumps(marker))
    return run


def test_report_shows_the_table_paired_differences_curves_examples_and_timings(run_dir):
    assert cli.main(["experiment-report", "--run_dir", str(run_dir)]) == 0
    report = (run_dir / "report.md").read_text()
    lines = report.splitlines()
    assert "protocol `ours`; senders by beam search (8 beams)." in report

    # The table, similarity with its interval; the teacher's multi-turn row is n/a.
    assert "| sft | single | 4 | 0.350 [0.200, 0.500] | 0.250 | 0.000 | 0.750 | 7 | 2.50 | 2.50 |" in lines
    assert "| teacher | multi | 0 | n/a | n/a | n/a | n/a | n/a | n/a | n/a |" in lines

    # Paired differences computed from the records: SFT - base is exactly 0.1 on every message.
    assert "| sft − base | single | 4 | similarity | +0.100 | [+0.100, +0.100] | above 0 |" in lines
    rl_sft = next(line for line in lines if line.startswith("| rl − sft | single | 4 | similarity |"))
    assert "| +0.100 |" in rl_sft
    # RL - teacher: (-0.1 - 0.2 + 0.1 + 0.0) / 4 = -0.05; success@0.5: RL 2 of 4, the teacher 4 of 4.
    assert any(line.startswith("| rl − teacher | single | 4 | similarity | -0.050 |") for line in lines)
    assert any(line.startswith("| rl − teacher | single | 4 | success@0.5 | -0.500 |") for line in lines)

    # Learning curves: PNGs, and first / last values from the logs (a None KL left out).
    assert (run_dir / "report" / "grpo_curves.png").stat().st_size > 0
    assert (run_dir / "report" / "sft_curves.png").stat().st_size > 0
    assert "| reward | -0.200 (step 1) | 0.400 (step 4) | 0.400 |" in lines
    assert "| KL to the reference | 0.000 (step 1) | 0.030 (step 4) | 0.030 |" in lines
    assert "| train loss | 2.000 (step 10) | 1.500 (step 20) | 1.500 |" in lines
    assert "![GRPO by step](report/grpo_curves.png)" in lines

    # Examples: per message the senders side by side, the judge's guesses beside their emoji.
    first = lines.index("| let's get pizza tonight | base | 😀 😀 | base guess 0 | 0.100 |")
    assert lines[first + 1] == "|  | sft | 🍕 🌙 | sft guess 0 | 0.200 |"
    assert lines[first + 2] == "|  | rl | 🍕 🍕 🌙 | rl guess 0 | 0.400 |"
    examples = lines[lines.index("## Held-out messages, side by side") : lines.index("## Stage timings")]
    assert not any("teacher guess" in line for line in examples)

    # What the senders learned: repeats, the most sent emoji and the most given guess with their shares.
    habits = "| system | repeats an emoji | most sent emoji (share) | most given guess (share) | turns |"
    assert table_under(lines, habits) == [
        "| base | 1.000 | 😀 😀 (1.000) | base guess 0 (0.250) | 1.00 |",
        "| sft | 0.000 | 🍕 🌙 (1.000) | sft guess 0 (0.250) | 1.00 |",
        "| rl | 1.000 | 🍕 🍕 🌙 (1.000) | I'm a student (0.750) | 1.00 |",
        "| teacher | 0.000 | 🍕 🌃 (1.000) | teacher guess 0 (0.250) | 1.00 |",
    ]

    # Stage timings in the order they finished, with the total.
    assert table_under(lines, "| stage | minutes | finished |") == [
        "| prompts | 0.5 | 2026-11-25T02:00:00 |",
        "| sft | 10.0 | 2026-11-25T02:10:00 |",
        "| total | 10.5 |  |",
    ]
    assert "the gloss view reads emoji names" in report


def test_the_held_out_evaluation_is_drawn_beside_the_training_curves(run_dir, monkeypatch):
    """GRPO's held-out lines (eval_before_train: step 0, eval_steps 2) as panels beside the training
    ones, retrieval@1 under the K its key names."""
    from emoji_rl.eval import experiment_report

    path = run_dir / "grpo" / "metrics.jsonl"
    trained = {m["step"]: m for m in map(json.loads, path.read_text().splitlines())}
    keys = ("eval/reward/mean", "eval/similarity", "eval/retrieval@1/10")
    values = {0: (-0.5, 0.1, 0.2), 2: (-0.1, 0.2, 0.3), 4: (0.2, 0.3, 0.5)}
    held_out = {step: dict(zip(keys, v, strict=True)) for step, v in values.items()}
    lines = [{"step": s, **trained.get(s, {}), **held_out.get(s, {})} for s in range(5)]
    path.write_text("".join(json.dumps(m) + "\n" for m in lines))
    drawn, draw = {}, experiment_report.line_figure

    def spy(curves, title, path, **kwargs):
        drawn[title] = curves
        return draw(curves, title, path, **kwargs)

    monkeypatch.setattr(experiment_report, "line_figure", spy)
    assert cli.main(["experiment-report", "--run_dir", str(run_dir)]) == 0
    grpo = drawn["GRPO by step"]
    assert list(grpo)[:4] == ["reward", "held-out reward", "similarity", "held-out similarity"]
    assert grpo["held-out retrieval@1 (of 10)"] == [(0.0, 0.2), (2.0, 0.3), (4.0, 0.5)]
    assert grpo["reward"][0] == (1.0, -0.2)  # the step-0 line holds no training figure
    report = (run_dir / "report.md").read_text().splitlines()
    assert experiment_report.HELD_OUT_NOTE in report
    assert "| held-out similarity | 0.100 (step 0) | 0.300 (step 4) | 0.300 |" in report
    assert "| held-out retrieval@1 (of 10) | 0.200 (step 0) | 0.500 (step 4) | 0.500 |" in report


def _eval_sft(run, name, temperature, sft_rows):
    """An eval-sft JSON: the data's answers (80 distinct emoji, 6.0 bits) and the given SFT rows."""
    stats = ["replies", "compliance", "emoji_per_message", "distinct_emoji", "entropy_bits", "top10_share"]
    reference = dict(zip(stats, [100, 1.0, 2.7, 80, 6.0, 0.3], strict=True))
    results = [
        {"system": "reference", "decoding": "data", **reference},
        {
            "system": "base",
            "decoding": "grammar",
            **dict(zip(stats, [100, 1.0, 8.0, 3, 1.0, 1.0], strict=True)),
        },
        *({"system": "sft", "decoding": d, **dict(zip(stats, v, strict=True))} for d, v in sft_rows),
    ]
    path = run / "reports" / name / "eval_sft.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"config": {"temperature": temperature}, "chats": 100, "results": results}))


def test_the_sft_senders_diversity_is_set_beside_its_datas_greedy_and_sampled(run_dir):
    _eval_sft(
        run_dir,
        "sft",
        0.0,
        [("grammar", [100, 1.0, 2.0, 20, 4.5, 0.7]), ("none", [100, 0.9, 2.0, 18, 4.2, 0.75])],
    )
    _eval_sft(run_dir, "sft-sampled", 1.0, [("grammar", [100, 1.0, 2.6, 88, 6.3, 0.25])])
    assert cli.main(["experiment-report", "--run_dir", str(run_dir)]) == 0
    lines = (run_dir / "report.md").read_text().splitlines()
    table = lines.index("## SFT against its data") + 6  # the heading, its text, the table's header
    # distinct / data: 20 / 80, 18 / 80, 88 / 80; entropy / data: 4.5 / 6, 4.2 / 6, 6.3 / 6. The second
    # run's data row is the first's, so it is shown once; the base model's rows are not shown.
    assert lines[table : table + 5] == [
        "| data (the teacher's answers) | 100 |  |  | 1.00 | 2.70 | 80 | 6.00 | 0.30 | 1.00 | 1.00 |",
        "| sft | 100 | grammar | 0 | 1.00 | 2.00 | 20 | 4.50 | 0.70 | 0.25 | 0.75 |",
        "| sft | 100 | none | 0 | 0.90 | 2.00 | 18 | 4.20 | 0.75 | 0.23 | 0.70 |",
        "| sft | 100 | grammar | 1 | 1.00 | 2.60 | 88 | 6.30 | 0.25 | 1.10 | 1.05 |",
        "",
    ]
    (run_dir / "reports" / "sft" / "eval_sft.json").write_text('{"results": [')
    from emoji_rl.eval import experiment_report

    with pytest.raises(UserError, match=r"reports/sft/eval_sft.json: not eval-sft's JSON"):
        experiment_report.main(experiment_report.Config(run_dir=str(run_dir)))


def test_the_senders_emoji_on_the_whole_split_are_set_beside_the_teachers_answers_to_it(run_dir):
    path = run_dir / "reports" / "retrieval" / "retrieval.json"
    retrieval = json.loads(path.read_text())
    retrieval["teacher_emoji"] = {"system": "teacher", "replies": 4, "compliance": 1.0, "emoji_per_message": 2.0,
                                  "distinct_emoji": 14, "entropy_bits": 5.0, "top10_share": 0.5}  # fmt: skip
    retrieval["rows"][2]["violations"] = 0.25  # rl: one message of four broke the format
    path.write_text(json.dumps(retrieval))
    assert cli.main(["experiment-report", "--run_dir", str(run_dir)]) == 0
    lines = (run_dir / "report.md").read_text().splitlines()
    table = lines.index("## SFT against its data") + 6  # no eval-sft runs: the data row comes first
    # Each sender: 7 distinct emoji and 2.5 bits (its row) against the teacher's 14 and 5.0; base and the
    # teacher itself are not senders shown here.
    assert lines[table : table + 4] == [
        "| data (the teacher's answers; held-out split, eval-retrieval) | 4 |  |  | 1.00 | 2.00 | 14 | 5.00 | 0.50 | 1.00 | 1.00 |",
        "| sft (held-out split, eval-retrieval) | 4 | grammar | 0 | 1.00 | 2.50 | 7 | 2.50 | 1.00 | 0.50 | 0.50 |",
        "| rl (held-out split, eval-retrieval) | 4 | grammar | 0 | 0.75 | 2.50 | 7 | 2.50 | 1.00 | 0.50 | 0.50 |",
        "",
    ]
    assert cli.main(["experiment-report", "--run_dir", str(run_dir), "--diversity_systems", "rl"]) == 0
    text = (run_dir / "report.md").read_text()
    assert "| rl (held-out split" in text and "| sft (held-out split" not in text


def test_missing_metrics_are_said_and_a_missing_evaluation_is_an_error(run_dir, tmp_path):
    (run_dir / "grpo" / "metrics.jsonl").unlink()
    assert cli.main(["experiment-report", "--run_dir", str(run_dir), "--examples", "1"]) == 0
    report = (run_dir / "report.md").read_text()
    assert (
        "No GRPO metrics" in report and report.count("| base |") == 3
    )  # the table, what the senders learned, one example
    with pytest.raises(UserError, match="eval-retrieval"):
        from emoji_rl.eval import experiment_report

        experiment_report.main(experiment_report.Config(run_dir=str(tmp_path / "nothing")))
    (run_dir / "stages" / "sft.done").write_text("{")  # read as the pipeline reads its markers
    with pytest.raises(UserError, match=r"stages/sft.done is not a stage marker"):
        experiment_report.main(experiment_report.Config(run_dir=str(run_dir)))
    (run_dir / "reports" / "retrieval" / "retrieval.json").write_text("{")
    with pytest.raises(UserError, match=r"retrieval/retrieval.json: not eval-retrieval's JSON"):
        experiment_report.main(experiment_report.Config(run_dir=str(run_dir)))


def test_the_senders_decoding_is_read_from_the_evaluation():
    from emoji_rl.eval.experiment_report import sender_decoding

    assert sender_decoding({}) == "senders greedy"  # an evaluation from before beam search
    assert sender_decoding({"sender_temperature": 0.0, "sender_num_beams": 1}) == "senders greedy"
    assert sender_decoding({"sender_temperature": 0.7, "sender_num_beams": 1}) == "senders sampled at T 0.7"
    guided = {"sender_temperature": 0.0, "sender_num_beams": 1, "sender_guidance_scale": 3.0}
    assert sender_decoding(guided) == "senders greedy, guidance scale 3"


# Both seats' evaluation, per system: the judge's similarity on its own emoji (mode pair) and its reading
# of the teacher's emoji (mode teacher) on four messages. Against the sender alone, `both` costs the judge
# 0.005 on every message and `both-w0.5` 0.05; as readers of the teacher, `both` beats the base by 0.1.
SEATS_JUDGE = {"alone": 0.3, "both": 0.295, "both-w0.5": 0.25, "base": 0.1}
SEATS_TEACHER = {"alone": 0.2, "both": 0.3, "both-w0.5": 0.3, "base": 0.2}
# The evaluation's own drift row (mean, low, high): the reader less the judge on the same emoji.
SEATS_DRIFT = {"alone": (-0.1, -0.2, 0.0), "both": (0.02, 0.01, 0.03), "both-w0.5": (0.1, 0.05, 0.15),
               "base": (-0.05, -0.1, 0.0)}  # fmt: skip


def _seats_run(run, judge_weights):
    """reports/both/both_seats.json in `run`, its systems' adapters beside the config.yaml of the run that
    trained them (both seats at each of `judge_weights`; the sender alone on the retrieval game)."""
    systems = {"base": "base"}
    trained = {"alone": {"game": "retrieval"}}
    trained |= {name: {"game": "both_seats", "judge_weight": w} for name, w in judge_weights.items()}
    for name, config in trained.items():
        adapter = run / name / "adapter"
        adapter.mkdir(parents=True)
        (run / name / "config.yaml").write_text("".join(f"{k}: {v}\n" for k, v in config.items()))
        systems[name] = str(adapter)
    records, rows = [], []
    for system in systems:
        for mode, reader in (
            ("pair", SEATS_JUDGE[system] + SEATS_DRIFT[system][0]),
            ("teacher", SEATS_TEACHER[system]),
        ):
            metrics = {"judge_similarity": SEATS_JUDGE[system], "reader_similarity": reader}
            if mode == "pair":
                metrics["drift"] = SEATS_DRIFT[system][0]
            records += [{"system": system, "mode": mode, "id": f"m{i}", "metrics": metrics} for i in range(4)]
            row = {"system": system, "mode": mode, "n": 4, **metrics, "turns": 1.0, "reader_unknown": 0.25}
            if mode == "pair":
                row |= dict(zip(("drift", "drift_lo", "drift_hi"), SEATS_DRIFT[system], strict=True))
            rows.append(row)
    both = {"data": "runs/experiment/data/sft_test.jsonl", "examples": 4, "judge": "hf(embedded)",
            "reader_view": "gloss", "systems": systems, "rows": rows, "comparisons": [], "records": records}  # fmt: skip
    (run / "reports" / "both").mkdir(parents=True)
    (run / "reports" / "both" / "both_seats.json").write_text(json.dumps(both))


def test_both_seats_answers_the_three_questions_and_draws_the_drift_curve(run_dir, monkeypatch):
    from emoji_rl.eval import seats_report

    _seats_run(run_dir, {"both": 0.75, "both-w0.5": 0.5})
    drawn, draw = {}, seats_report.interval_figure

    def spy(panels, title, path, **kwargs):
        drawn.update(panels)
        return draw(panels, title, path, **kwargs)

    monkeypatch.setattr(seats_report, "interval_figure", spy)
    assert cli.main(["experiment-report", "--run_dir", str(run_dir)]) == 0
    lines = (run_dir / "report.md").read_text().splitlines()
    assert "| both | pair | 4 | 0.295 | 0.315 | +0.020 [+0.010, +0.030] | 1.00 | 0.250 |" in lines
    assert "| both | teacher | 4 | 0.295 | 0.300 | n/a | 1.00 | 0.250 |" in lines
    # (a) -0.005 on every message: its interval is a point, above -0.01; (b) the row's own interval;
    # (c) +0.1 on every message.
    assert table_under(lines, "| question | measure | messages | mean | 95% CI | answer |") == [
        "| (a) the judge reads both seats' emoji no worse than alone's | both − alone, pair, judge similarity "
        "| 4 | -0.005 | [-0.005, -0.005] | yes: low end -0.0050, bound -0.01 |",
        "| (b) the pair reads its own emoji better than the judge | both, pair, drift (reader − judge) "
        "| 4 | +0.020 | [+0.010, +0.030] | yes: low end +0.0100, bound +0.00 |",
        "| (c) it reads the teacher's emoji better than the base model | both − base, teacher, reader similarity "
        "| 4 | +0.100 | [+0.100, +0.100] | yes: low end +0.1000, bound +0.00 |",
    ]
    # The drift curve: the runs in both seats by the reader's weight (1 - judge_weight), not the sender
    # alone (trained on the retrieval game) nor the base model (no adapter).
    curve = "| reader's weight | system | judge similarity | − alone [95% CI] | drift [95% CI] |"
    assert table_under(lines, curve) == [
        "| 0.25 | both | 0.295 | -0.005 [-0.005, -0.005] | +0.020 [+0.010, +0.030] |",
        "| 0.5 | both-w0.5 | 0.250 | -0.050 [-0.050, -0.050] | +0.100 [+0.050, +0.150] |",
    ]
    assert drawn["drift (reader − judge)"] == [(0.25, 0.02, 0.01, 0.03), (0.5, 0.1, 0.05, 0.15)]
    assert [point[0] for point in drawn["judge similarity − alone"]] == [0.25, 0.5]
    assert "![the drift curve](report/drift_curve.png)" in lines
    assert (run_dir / "report" / "drift_curve.png").stat().st_size > 0
    # The retrieval experiment's page is still there, before it.
    assert lines.index("## Systems on the held-out split") < lines.index("## Both seats")


def test_both_seats_alone_with_one_run_and_no_base_is_reported_without_the_curve(tmp_path):
    """A run directory with the both-seats evaluation only (no eval-retrieval): its section, the
    question the evaluation cannot answer said so, and no curve for one run in both seats."""
    run = tmp_path / "experiment"
    _seats_run(run, {"both": 0.75})
    both = run / "reports" / "both" / "both_seats.json"
    evaluated = json.loads(both.read_text())
    evaluated["records"] = [r for r in evaluated["records"] if r["system"] != "base"]
    drift = next(r for r in evaluated["rows"] if (r["system"], r["mode"]) == ("both", "pair"))
    drift["drift_lo"] = -0.00004  # below 0 by less than three places show
    both.write_text(json.dumps(evaluated))
    assert cli.main(["experiment-report", "--run_dir", str(run)]) == 0
    report = (run / "report.md").read_text()
    lines = report.splitlines()
    assert "## Both seats" in lines and "## Systems on the held-out split" not in lines
    answers = {line[:6]: line.rsplit(" | ", 1)[1] for line in lines if line.startswith("| (")}
    assert answers == {
        "| (a) ": "yes: low end -0.0050, bound -0.01 |",
        "| (b) ": "no: low end -0.0000, bound +0.00 |",
        "| (c) ": "n/a: not evaluated |",
    }
    assert "### The drift curve" not in lines and not (run / "report" / "drift_curve.png").exists()
    assert "No GRPO metrics" in report
