"""eval-wordle's numbers: rates from final StepResults, game-level bootstrap intervals, and the
entropy solver's row played through the same game."""

import asyncio
import json

import pytest

from emoji_rl import cli
from emoji_rl.games.wordle.evaluation import intervals, solver_replies, summarize
from emoji_rl.games.wordle.game import WordleBuilder, WordleRules
from emoji_rl.io.jsonl import write_jsonl
from emoji_rl.play.evaluate import ScriptedSender
from emoji_rl.play.loop import play
from emoji_rl.play.types import StepResult


def final(won, turns, format_rate, consistency, reward=1.0):
    metrics = {
        "won": float(won),
        "turns": float(turns),
        "format_rate": format_rate,
        "consistent_rate": consistency,
        "invalid_rate": 0.0,
        "repeat_rate": 0.0,
    }
    return StepResult(True, reward, metrics=metrics)


def test_turn_shares_are_weighted_by_turns_and_guesses_count_won_games_only():
    finals = [final(True, 2, 1.0, 1.0), final(False, 6, 0.5, 0.5, reward=0.0)]
    row = summarize(finals)
    # won 1 of 2, in 2 guesses; format (2*1 + 6*0.5) / 8 = 5/8; consistency the same
    assert row["win_rate"] == 0.5 and row["mean_guesses"] == 2.0 and row["turns"] == 4.0
    assert row["format"] == pytest.approx(5 / 8) and row["consistent"] == pytest.approx(5 / 8)
    assert row["reward"] == 0.5


def test_intervals_resample_games_and_bracket_the_estimate():
    finals = [final(True, 3, 1.0, 1.0)] * 30 + [final(False, 6, 0.0, 0.5)] * 10
    ci = intervals(finals, 500, seed=0)
    low, high = ci["win_rate"]
    assert low < 0.75 < high and low > 0.5 and high < 0.95
    assert ci["mean_guesses"] == [3.0, 3.0]  # every won game took 3 guesses
    assert intervals(finals, 500, seed=0) == ci  # seeded
    # no game won in any resample: no interval for mean guesses
    assert intervals([final(False, 6, 1.0, 1.0)] * 5, 50, seed=0)["mean_guesses"] is None


def test_the_solver_row_wins_with_strict_format_and_consistent_guesses(smollm2_tokenizer):
    builder = WordleBuilder(smollm2_tokenizer, WordleRules())
    answers = ["above", "speed", "watch"]  # watch: one of hard mode's traps, lost in six
    records = [{"answer": a} for a in answers]
    solver = ScriptedSender(smollm2_tokenizer, solver_replies(builder, records), range(len(records)))
    finals = [e.turns[-1].result for e in asyncio.run(play([builder(r) for r in records], solver))]
    row = summarize(finals)
    assert row["win_rate"] == pytest.approx(2 / 3) and row["format"] == 1.0 and row["consistent"] == 1.0
    assert row["invalid"] == 0.0 and row["repeated"] == 0.0


def test_eval_wordle_with_the_solver_alone_logs_each_game_and_a_rerun_reuses_them(tmp_path, capsys):
    data, config, out = tmp_path / "eval.jsonl", tmp_path / "solver.yaml", tmp_path / "report"
    write_jsonl(data, [{"id": a, "answer": a} for a in ("above", "speed", "watch")])
    config.write_text("systems: []\n")  # no model: the entropy solver's row alone
    args = ["eval-wordle", "--config", str(config), "--data", str(data), "--output_dir", str(out)]
    assert cli.main(args) == 0
    report = json.loads((out / "wordle.json").read_text())
    [row] = report["rows"]
    assert (row["system"], row["mode"], row["n"], row["win_rate"]) == (
        "solver",
        "multi",
        3,
        pytest.approx(2 / 3),
    )
    records = {r["id"]: r for r in report["records"]}
    assert [turn["guess"] for turn in records["above"]["turns"]][-1] == "above"
    assert len(records["watch"]["turns"]) == 6 and records["watch"]["metrics"]["won"] == 0.0
    assert summarize([StepResult(True, r["reward"], metrics=r["metrics"]) for r in records.values()]) == {
        k: v for k, v in row.items() if k not in ("system", "mode", "n", "ci95")
    }
    assert len((out / "wordle_records.jsonl").read_text().splitlines()) == 1 + 3  # its config, its games
    capsys.readouterr()
    assert cli.main(args) == 0
    assert "reusing 3 records" in capsys.readouterr().out
