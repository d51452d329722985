"""`emoji-rl eval-wordle` end to end on the embedded model: table, JSON and PNG for each system."""

import json

import pytest

from emoji_rl.cli import main as cli_main
from emoji_rl.io.jsonl import write_jsonl

pytestmark = pytest.mark.slow


def test_eval_wordle_writes_table_json_and_plot(tmp_path, capsys):
    data = tmp_path / "eval.jsonl"
    write_jsonl(data, [{"id": "wordle-above", "answer": "above"}, {"id": "wordle-speed", "answer": "speed"}])
    out = tmp_path / "report"
    argv = ["eval-wordle", "--data", str(data), "--output_dir", str(out), "--max_turns", "2"]
    assert cli_main([*argv, "--max_new_tokens", "16"]) == 0
    report = json.loads((out / "wordle.json").read_text())
    assert [r["system"] for r in report["rows"]] == ["base", "solver"] and report["games"] == 2
    row = report["rows"][0]
    assert 0.0 <= row["invalid"] <= 1.0 and 1.0 <= row["turns"] <= 2.0
    assert set(row["ci95"]) == {"win_rate", "mean_guesses", "format", "consistent"}
    assert (out / "wordle.png").stat().st_size > 0
    assert "win_rate" in capsys.readouterr().out
