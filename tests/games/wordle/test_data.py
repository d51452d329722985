"""`emoji-rl wordle-data`: held-out answers never reach training; traces are the game's own chat."""

import asyncio
import json

import pytest

from emoji_rl.cli import main as cli_main
from emoji_rl.games.wordle.game import WordleBuilder, WordleRules
from emoji_rl.io.jsonl import read_jsonl
from emoji_rl.lm.template import stop_token_id


def test_wordle_data_holds_out_eval_answers_and_replays_in_the_game(tmp_path, smollm2_tokenizer):
    out = tmp_path / "wordle"
    assert cli_main(["wordle-data", "--output_dir", str(out), "--eval_answers", "315"]) == 0
    sft = read_jsonl(out / "wordle_sft_train.jsonl")
    train = {r["answer"] for r in read_jsonl(out / "wordle_rl_train.jsonl")}
    held_out = {r["answer"] for r in read_jsonl(out / "wordle_rl_eval.jsonl")}
    assert len(train) == 2000 and len(held_out) == 315 and not train & held_out
    assert {r["answer"] for r in sft} == train
    stats = json.loads((out / "wordle_data_stats.json").read_text())
    assert (
        stats["solver_win_rate"] == pytest.approx(2306 / 2315)
        and abs(stats["solver_mean_guesses"] - 3.591) < 0.001
    )

    # The last trace of a game, replayed in the game, shows the same user turns and wins.
    answer = sorted(train)[0]
    trace = [r for r in sft if r["answer"] == answer][-1]["messages"]
    game = WordleBuilder(smollm2_tokenizer, WordleRules())({"answer": answer})
    asyncio.run(game.start())
    replies = [m["content"] for m in trace if m["role"] == "assistant"]
    for reply in replies:
        ids = smollm2_tokenizer(reply, add_special_tokens=False)["input_ids"]
        result = asyncio.run(game.step((*ids, stop_token_id(smollm2_tokenizer))))
    assert result.done and result.metrics["won"] == 1.0 and result.metrics["format_rate"] == 1.0
    assert game.history[: len(trace) - 1] == trace[:-1]
