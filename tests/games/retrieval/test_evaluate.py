import json
import math

import pytest
import torch

from emoji_rl import cli
from emoji_rl.config import parse_config
from emoji_rl.decode import senders
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.games.retrieval import evaluation as retrieval_records
from emoji_rl.lm import models
from emoji_rl.play import compare, eval_records, evaluate
from emoji_rl.play.evaluate import config_class
from emoji_rl.play.similarity import Similarity

RECORDS_LOG = "retrieval_records.jsonl"  # where eval-retrieval appends its records

RETRIEVAL = config_class("retrieval")  # `eval --game retrieval`'s Config


def test_compare_defaults_to_adjacent_systems_and_checks_names():
    systems = senders.eval_systems(["base", "sft=s", "rl=r"])
    assert compare.compare_pairs([], systems) == [("sft", "base"), ("rl", "sft")]
    assert compare.compare_pairs(["rl:base"], systems) == [("rl", "base")]
    for bad in ("rl-sft", "rl:teacher", "rl:rl"):
        with pytest.raises(ValueError, match="A:B"):
            compare.compare_pairs([bad], systems)
    with pytest.raises(UserError, match="modes"):
        parse_config(RETRIEVAL, ["--modes", "single", "both"], "eval-retrieval")
    # Beam search and guidance look for the sender's best emoji message: greedy and constrained only.
    for bad in (["--num_beams", "0"], ["--num_beams", "4", "--temperature", "0.7"]):
        with pytest.raises(UserError, match="num_beams"):
            parse_config(RETRIEVAL, bad, "eval-retrieval")
    for bad in (["--num_beams", "4", "--protocol", "seed"], ["--guidance_scale", "2", "--temperature", "1"]):
        with pytest.raises(UserError, match="need the greedy, emoji-constrained sender"):
            parse_config(RETRIEVAL, bad, "eval-retrieval")


def fixed_answers(cfg, targets):
    """`senders.fixed_answers` of `cfg`'s systems, with the settings eval-retrieval gives it."""
    settings = (cfg.data, cfg.min_emoji, cfg.max_emoji, cfg.random_length, cfg.seed)
    return senders.fixed_answers(senders.eval_systems(cfg.systems), targets, *settings)


def test_a_teacher_file_of_other_messages_is_refused_and_random_alone_sends_random_length(tmp_path):
    path = tmp_path / "sft_test.jsonl"
    path.write_text(json.dumps({"target": "other", "messages": [ANSWER("🍕 🌙")]}) + "\n")
    cfg = RETRIEVAL(systems=[f"teacher={path}", "random"])
    with pytest.raises(UserError, match="answers none of the 2 targets"):
        fixed_answers(cfg, ["a", "b"])
    cfg = RETRIEVAL(systems=["random"], random_length=4)
    answers = fixed_answers(cfg, ["a", "b"])["random"]
    assert [len(parse_message(a).emoji) for a in answers] == [4, 4]


def test_reference_examples_keep_only_the_systems_without_an_adapter_to_the_first_targets():
    base, sft = senders.System("base", "base"), senders.System("sft", "adapter", "runs/sft/adapter")
    teacher = senders.System("teacher", "teacher", "sft_test.jsonl")
    answers = ["🍕", None, "🎂", "🔑", "🎬"]
    assert eval_records.played_indices(sft, None, 5, 2) == [0, 1, 2, 3, 4]
    assert eval_records.played_indices(base, None, 5, 2) == [0, 1]
    assert eval_records.played_indices(teacher, answers, 5, 3) == [0, 2]  # and only where it answered
    assert eval_records.played_indices(teacher, answers, 5, 0) == [0, 2, 3, 4]  # 0: every target
    assert eval_records.played_indices(base, None, 5, 9) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="reference_examples=-1"):
        RETRIEVAL(reference_examples=-1)


def test_distractors_are_the_same_for_every_system_and_retrieval_ranks_among_them(embedder):
    targets = ["I love pizza", "the car broke down", "my cat is asleep", "we won the football match"]
    candidates = retrieval_records.distractor_sets(targets, k=3, seed=0)
    assert candidates == retrieval_records.distractor_sets(targets, k=3, seed=0)
    for target, cands in zip(targets, candidates, strict=True):
        assert cands[0] == target and len(set(cands)) == 3 and set(cands) <= set(targets)
    everything = retrieval_records.distractor_sets(targets, k=4, seed=0)
    guesses = ["pizza is my favourite food", "engine trouble with the car", "the dog barks", "pizza"]
    # 1 and 2 pick their own target out of all four; 4 (pizza) picks target 1, a miss.
    hits = retrieval_records.retrieved(Similarity(embedder), everything, guesses)
    assert hits[:2] == [True, True] and hits[3] is False
    with pytest.raises(UserError, match="at least 5 distinct targets"):
        retrieval_records.distractor_sets(targets, k=5, seed=0)


def ANSWER(emoji):
    return {"role": "assistant", "content": emoji}


TARGETS = [
    "let's get pizza tonight",
    "the train is late again",
    "happy birthday to my sister",
    "I lost my keys at the beach",
    "we are going to the cinema",
    "my cat is sleeping on the sofa",
]
TEACHER = ["🍕 🌙", "🚆 ⏰", "🎂 👧 🎉", "🔑 🏖️", "🎬 🍿", None]  # the teacher never answered the last


@pytest.fixture
def shared_embedder(monkeypatch, embedder):
    """The session's MiniLM instead of a fresh load per CLI run."""
    monkeypatch.setattr(models, "load_embedder", lambda *args, **kwargs: embedder)


def write_inputs(tmp_path):
    """The held-out messages and the teacher's SFT split of them."""
    data = tmp_path / "rl_eval.jsonl"
    data.write_text("".join(json.dumps({"id": f"m{i}", "target": t}) + "\n" for i, t in enumerate(TARGETS)))
    teacher = tmp_path / "sft_train.jsonl"
    teacher.write_text(
        "".join(
            json.dumps({"id": "x", "target": t, "messages": [*sender_messages(t), ANSWER(a)]}) + "\n"
            for t, a in zip(TARGETS, TEACHER, strict=True)
            if a is not None
        )
    )
    return data, teacher


def test_teacher_and_random_through_the_same_judge_with_paired_differences(tmp_path, capsys, shared_embedder):
    data, teacher = write_inputs(tmp_path)
    out = tmp_path / "report"
    args = ["eval-retrieval", "--systems", f"teacher={teacher}", "random", "--data", str(data)]
    args += ["--judge", "lexicon", "--distractors", "4", "--output_dir", str(out)]
    assert cli.main(args) == 0
    report = json.loads((out / "retrieval.json").read_text())
    rows = {(r["system"], r["mode"]): r for r in report["rows"]}
    assert list(rows) == [
        ("teacher", "single"),
        ("teacher", "multi"),
        ("random", "single"),
        ("random", "multi"),
    ]
    assert rows["teacher", "multi"]["n"] == 0 and "similarity" not in rows["teacher", "multi"]
    assert rows["teacher", "single"]["n"] == 5 and rows["random", "single"]["n"] == 6

    records = {(r["system"], r["id"]): r for r in report["records"]}
    # The judge read the teacher's own emoji: the lexicon judge names them.
    pizza = records["teacher", "m0"]
    assert pizza["target"] == TARGETS[0] and pizza["turns"] == [
        {"emoji": "🍕 🌙", "guess": "pizza, crescent moon"}
    ]
    # Random answers are as long as the teacher's for the same message, 3 where it has none.
    lengths = [len(parse_message(records["random", f"m{i}"]["turns"][0]["emoji"]).emoji) for i in range(6)]
    assert lengths == [2, 2, 3, 2, 2, 3]
    # The row is the mean over its records; success@0.5 sits beside the game's thresholds.
    teacher_sims = [records["teacher", f"m{i}"]["similarity"] for i in range(5)]
    assert rows["teacher", "single"]["similarity"] == pytest.approx(sum(teacher_sims) / 5)
    assert rows["teacher", "single"]["success@0.5"] == sum(s >= 0.5 for s in teacher_sims) / 5
    assert {"success@0.65", "success@0.7", "success@0.85", "retrieval@1/4", "emoji_per_message"} <= set(
        rows["random", "single"]
    )
    assert rows["teacher", "single"]["emoji_per_message"] == pytest.approx(11 / 5)

    # Default comparison: the adjacent pair random - teacher, over the 5 messages both played.
    diffs = {(c["metric"]): c for c in report["comparisons"]}
    assert set(diffs) == {"similarity", "success@0.5", "success@0.7", "retrieval@1"}
    random_sims = [records["random", f"m{i}"]["similarity"] for i in range(5)]
    # retrieval@1 paired as 0/1 per message: the difference of the hit counts
    hits = {s: sum(records[s, f"m{i}"]["retrieved"] for i in range(5)) for s in ("random", "teacher")}
    assert hits == {"random": 1, "teacher": 5}
    assert diffs["retrieval@1"]["mean"] == pytest.approx((hits["random"] - hits["teacher"]) / 5)
    similarity = diffs["similarity"]
    assert (similarity["a"], similarity["b"], similarity["mode"], similarity["n"]) == (
        "random",
        "teacher",
        "single",
        5,
    )
    assert similarity["mean"] == pytest.approx((sum(random_sims) - sum(teacher_sims)) / 5)
    assert similarity["low"] <= similarity["mean"] <= similarity["high"]
    printed = capsys.readouterr().out
    assert "random - teacher (single, 5 messages) similarity" in printed and "success@0.5" in printed

    # --modes single: no multi rows at all; the same messages and random draws give the same numbers.
    assert cli.main([*args, "--modes", "single", "--output_dir", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "retrieval.json").read_text())
    assert [r["mode"] for r in again["rows"]] == ["single", "single"]
    assert again["records"] == [r for r in report["records"] if r["mode"] == "single"]

    # --reference_examples 3: teacher and random play only the first 3 targets (the teacher all 3: it
    # answered them), and the difference is over those 3, the same records as before for them.
    capped = tmp_path / "capped"
    assert (
        cli.main([*args, "--modes", "single", "--reference_examples", "3", "--output_dir", str(capped)]) == 0
    )
    capped_report = json.loads((capped / "retrieval.json").read_text())
    assert [r["n"] for r in capped_report["rows"]] == [3, 3]
    first3 = [r for r in again["records"] if int(r["id"][1:]) < 3]
    assert [{**r, "similarity": None} for r in capped_report["records"]] == [
        {**r, "similarity": None} for r in first3
    ]
    assert [r["similarity"] for r in capped_report["records"]] == pytest.approx(
        [r["similarity"] for r in first3], abs=1e-6
    )
    assert {c["n"] for c in capped_report["comparisons"]} == {3}
    # The teacher's emoji statistics are over all 5 of its answers, the 3 it played and the 2 it did not:
    # 11 emoji in 5 messages, each emoji once.
    assert capped_report["teacher_emoji"] == again["teacher_emoji"]
    data = capped_report["teacher_emoji"]
    assert (data["system"], data["replies"], data["distinct_emoji"]) == ("teacher", 5, 11)
    assert data["compliance"] == 1.0
    assert data["emoji_per_message"] == pytest.approx(11 / 5)
    assert data["entropy_bits"] == pytest.approx(math.log2(11))

    # Played a sender batch at a time (under a progress bar): 2 a batch, each game gets its own answer.
    args += ["--modes", "single", "--batch_size", "2", "--output_dir", str(tmp_path / "batches")]
    assert cli.main(args) == 0
    batches = json.loads((tmp_path / "batches" / "retrieval.json").read_text())["records"]
    assert [{**r, "similarity": None} for r in batches] == [
        {**r, "similarity": None} for r in again["records"]
    ]
    # (the embedder's batches differ too: similarities within float32's rounding)
    assert [r["similarity"] for r in batches] == pytest.approx(
        [r["similarity"] for r in again["records"]], abs=1e-6
    )


@pytest.fixture
def batches(monkeypatch):
    """Each sender batch `play`ed: its size and one torch draw, as a sampled sender or judge would make
    first; `batches.fail_at = n` makes the n-th batch raise, as running out of memory would."""
    real = evaluate.play

    class Batches(list):
        fail_at = 0

    played = Batches()

    def play(games, sender):
        played.append((len(games), torch.rand(1).item()))
        if len(played) == played.fail_at:
            raise RuntimeError("CUDA out of memory")
        return real(games, sender)

    monkeypatch.setattr(evaluate, "play", play)
    return played


def fixed_systems_args(tmp_path):
    """teacher (5 of the 6 messages: sender batches [0, 1], [2, 3], [4]) and random (6: [0, 1], [2, 3],
    [4, 5]), single-turn, 2 games a batch."""
    data, teacher = write_inputs(tmp_path)
    args = ["eval-retrieval", "--systems", f"teacher={teacher}", "random", "--data", str(data)]
    return [*args, "--judge", "lexicon", "--distractors", "4", "--modes", "single", "--batch_size", "2"]


def log_lines(out):
    return [json.loads(line) for line in (out / RECORDS_LOG).read_text().splitlines()]


def test_records_are_logged_as_played_and_a_rerun_plays_only_the_missing_games(
    tmp_path, capsys, shared_embedder, batches
):
    args = fixed_systems_args(tmp_path)
    whole = tmp_path / "whole"
    assert cli.main([*args, "--output_dir", str(whole)]) == 0
    uninterrupted = list(batches)
    assert [size for size, _ in uninterrupted] == [2, 2, 1, 2, 2, 2]

    # random's second batch fails: the teacher's 5 records and random's first 2 are on disk already.
    out = tmp_path / "report"
    batches.clear()
    batches.fail_at = 5
    with pytest.raises(RuntimeError, match="out of memory"):
        cli.main([*args, "--output_dir", str(out)])
    config, *records = log_lines(out)
    assert set(config) == {"config"} and config["config"]["distractors"] == 4
    assert [(r["system"], r["id"]) for r in records] == [
        *[("teacher", f"m{i}") for i in range(5)],
        ("random", "m0"),
        ("random", "m1"),
    ]
    assert all("retrieved" in r for r in records) and not (out / "retrieval.json").exists()

    # The rerun plays random's last two batches only, drawing what the whole run drew for them (each
    # batch is seeded by its first message, not by the batches played before it), and reports the same.
    batches.clear()
    batches.fail_at = 0
    capsys.readouterr()
    assert cli.main([*args, "--output_dir", str(out)]) == 0
    assert batches == uninterrupted[4:]
    assert f"reusing 7 records from {out / RECORDS_LOG}" in capsys.readouterr().out
    assert json.loads((out / "retrieval.json").read_text()) == json.loads(
        (whole / "retrieval.json").read_text()
    )
    assert log_lines(out) == log_lines(whole)

    # Once complete, a rerun plays nothing.
    batches.clear()
    assert cli.main([*args, "--output_dir", str(out)]) == 0
    assert batches == []


def test_a_rerun_of_another_config_is_refused_and_a_cut_off_last_line_is_redone(
    tmp_path, capsys, caplog, shared_embedder, batches
):
    args = fixed_systems_args(tmp_path)
    out = tmp_path / "report"
    assert cli.main([*args, "--output_dir", str(out)]) == 0
    report = json.loads((out / "retrieval.json").read_text())
    log = out / RECORDS_LOG
    complete = log.read_bytes()

    # Killed while writing random's last record: half a line, no newline. The rerun drops it with a
    # warning and replays that record's batch whole (its draws follow from its first message), logging
    # only the record it lacked.
    lines = complete.splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]) + lines[-1][:25])
    batches.clear()
    assert cli.main([*args, "--output_dir", str(out)]) == 0
    assert "cutting off 25 bytes of an interrupted append" in caplog.text
    assert [size for size, _ in batches] == [2]
    assert log.read_bytes() == complete
    assert json.loads((out / "retrieval.json").read_text()) == report

    # Another config's records are not mixed in: the run stops before playing, naming the file, the key
    # and the way out, and the log stays as it was.
    capsys.readouterr()
    batches.clear()
    assert cli.main([*args, "--distractors", "3", "--output_dir", str(out)]) == 2
    error = capsys.readouterr().err
    assert f"{log} holds the records of another config: distractors is 4 there and 3 here" in error
    assert f"Delete {log} to start over, or choose another --output_dir" in error
    other = tmp_path / "other.jsonl"
    changed = [*TARGETS[:-1], "my dog is sleeping on the sofa"]  # one the teacher has no answer for
    other.write_text("".join(json.dumps({"id": f"m{i}", "target": t}) + "\n" for i, t in enumerate(changed)))
    assert cli.main([*args, "--data", str(other), "--output_dir", str(out)]) == 2
    assert "another config: data is 'sha256:" in capsys.readouterr().err
    assert batches == [] and log.read_bytes() == complete


@pytest.mark.slow
def test_the_judge_reads_the_same_emoji_the_same_way_at_temperature_0(smollm2_model, smollm2_tokenizer):
    import asyncio

    from emoji_rl.play.guessing import JudgeInput
    from emoji_rl.play.judge import HFJudge

    judge = HFJudge(smollm2_model, smollm2_tokenizer, "gloss", "smollm2", temperature=0.0, max_new_tokens=12)
    pizza, train = JudgeInput((("🍕", "🌙"),)), JudgeInput((("🚆", "⏰", "😤"),))
    torch.manual_seed(1)
    first = asyncio.run(judge.guess([pizza, train, pizza]))
    torch.manual_seed(2)
    alone = asyncio.run(judge.guess([pizza]))
    # Within a batch, across batches of other sizes (other padding) and other seeds: one guess.
    assert first[0] == first[2] == alone[0]


@pytest.mark.slow
def test_eval_retrieval_compares_systems(tmp_path, capsys, noisy_adapter):
    data = tmp_path / "eval.jsonl"
    targets = [
        f"let's meet at the {place} at {hour} o'clock"
        for place, hour in zip(
            ["beach", "park", "cafe", "station", "museum", "gym"], range(1, 7), strict=True
        )
    ]
    data.write_text("".join(json.dumps({"id": str(i), "target": t}) + "\n" for i, t in enumerate(targets)))
    code = cli.main(
        [
            "eval-retrieval",
            "--systems",
            "base",
            f"noisy={noisy_adapter}",
            "--data",
            str(data),
            "--judge",
            "lexicon",
            "--max_turns",
            "2",
            "--distractors",
            "4",
            "--max_new_tokens",
            "24",
            "--output_dir",
            str(tmp_path / "report"),
        ]
    )
    assert code == 0
    report = json.loads((tmp_path / "report" / "retrieval.json").read_text())
    assert [(r["system"], r["mode"]) for r in report["rows"]] == [
        ("base", "single"),
        ("base", "multi"),
        ("noisy", "single"),
        ("noisy", "multi"),
    ]
    for row in report["rows"]:
        assert 0.0 <= row["success@0.5"] <= 1.0 and row["turns"] >= 1.0
        assert row["turns"] <= (1.0 if row["mode"] == "single" else 2.0)
    assert report["caveat"] and (tmp_path / "report" / "retrieval.png").stat().st_size > 0
    assert {(c["a"], c["b"], c["mode"]) for c in report["comparisons"]} == {
        ("noisy", "base", "single"),
        ("noisy", "base", "multi"),
    }
    multi = [r for r in report["records"] if r["system"] == "noisy" and r["mode"] == "multi"]
    assert [r["target"] for r in multi] == targets and all(1 <= len(r["turns"]) <= 2 for r in multi)
    assert "retrieval@1/4" in capsys.readouterr().out

    # The seed's protocol: sampled at T 0.7, no grammar; a reply the parser rejects scores 0.
    seed_out = tmp_path / "seed"
    args = [
        "eval-retrieval",
        "--systems",
        "base",
        "--data",
        str(data),
        "--judge",
        "lexicon",
        "--modes",
        "single",
    ]
    args += [
        "--protocol",
        "seed",
        "--distractors",
        "4",
        "--max_new_tokens",
        "24",
        "--output_dir",
        str(seed_out),
    ]
    assert cli.main(args) == 0
    seed = json.loads((seed_out / "retrieval.json").read_text())
    assert (seed["protocol"], seed["sender_temperature"]) == ("seed", 0.7)
    assert [r["mode"] for r in seed["rows"]] == ["single"]
    violations = [r for r in seed["records"] if r["violation"]]
    assert violations, "the base model, unconstrained, writes words"
    assert all(r["similarity"] == 0.0 and "guess" not in r["turns"][0] for r in violations)
    assert seed["rows"][0]["violations"] == len(violations) / len(targets)

    # Guided beam search for the sender in the multi-turn game (its first turn is the single game's):
    # every turn a message, its prompt read afresh. Three targets: beams and guidance are 4 passes a token.
    beam_out = tmp_path / "beam"
    args = ["eval-retrieval", "--systems", "base", "--data", str(data), "--judge", "lexicon"]
    args += ["--modes", "multi", "--max_examples", "3", "--max_turns", "2", "--distractors", "3"]
    args += ["--num_beams", "2", "--guidance_scale", "2"]
    assert cli.main([*args, "--output_dir", str(beam_out)]) == 0
    beam = json.loads((beam_out / "retrieval.json").read_text())
    assert (beam["sender_num_beams"], beam["sender_guidance_scale"]) == (2, 2.0)
    assert (report["sender_num_beams"], report["sender_guidance_scale"]) == (1, 1.0)
    assert all(row["violations"] == 0 for row in beam["rows"])
    assert all(parse_message(t["emoji"]).ok for r in beam["records"] for t in r["turns"])


@pytest.mark.slow
def test_a_judge_server_that_is_not_there_is_said_at_once_and_fails_with_its_url_and_a_hint(tmp_path):
    import subprocess
    import sys
    import time

    data = tmp_path / "eval.jsonl"
    data.write_text("".join(json.dumps({"target": f"let's get pizza at {h}"}) + "\n" for h in range(10)))
    wait_s = 4
    stage = [sys.executable, "-m", "emoji_rl.cli", "eval-retrieval", "--data", str(data)]
    stage += ["--output_dir", str(tmp_path / "out"), "--judge", "openai", "--judge_url", "http://127.0.0.1:9"]
    with subprocess.Popen([*stage, "--server_wait_s", str(wait_s)], stderr=subprocess.PIPE, text=True) as run:
        lines = [(time.monotonic(), line) for line in run.stderr]
    assert run.returncode == 2, lines
    said = [at for at, line in lines if "waiting for the judge server at http://127.0.0.1:9/health" in line]
    assert said, lines
    # Said when the wait began, not when it ended: the wait ran its whole length after it.
    ended, error = lines[-1]
    assert wait_s - 0.5 < ended - said[0] < wait_s + 5
    assert "http://127.0.0.1:9/health within 4 s" in error
    assert "make serve-judge" in error and "--dry-run" in error and "--server_wait_s" in error


def test_comparisons_print_their_interval_and_name_only_a_side_of_zero():
    row = {"a": "rl", "b": "sft", "mode": "single", "n": 400, "metric": "similarity", "mean": 0.012}
    lines = compare.format_comparisons(
        [
            {**row, "low": 0.001, "high": 0.023},
            {**row, "b": "teacher", "mean": -0.08, "low": -0.1, "high": -0.06},
            {**row, "b": "base", "mean": 0.002, "low": -0.01, "high": 0.014},
            {**row, "b": "random", "low": None, "high": None},  # one message: no interval, no line
        ]
    ).splitlines()
    assert lines == [
        "rl - sft (single, 400 messages) similarity   +0.012  [+0.001, +0.023]  above 0",
        "rl - teacher (single, 400 messages) similarity   -0.080  [-0.100, -0.060]  below 0",
        "rl - base (single, 400 messages) similarity   +0.002  [-0.010, +0.014]",
    ]
