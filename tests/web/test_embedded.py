"""play-web on the embedded models (SmolLM2 sender, lexicon judge, MiniLM scorer): load_game wires
the real models, and a guess scores as the trainer scores it."""

from __future__ import annotations

import json
import time

import pytest

from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.rl.reward import Similarity
from emoji_rl.web.app import Config, load_game


@pytest.mark.slow
def test_a_round_on_the_embedded_models(tmp_path, embedder):
    data = tmp_path / "eval.jsonl"
    data.write_text(json.dumps({"id": "c1", "target": "Let's grab pizza tonight"}) + "\n")
    cfg = Config(
        systems=["base"], data=str(data), db=str(tmp_path / "a.db"), judge="lexicon", max_new_tokens=24
    )
    game = load_game(cfg)
    try:
        job = game.start_guess("ann")
        status = game.jobs.status(job)
        while status["state"] in {"queued", "running"}:
            time.sleep(0.1)
            status = game.jobs.status(job)
        assert status["state"] == "done", status
        shown = status["result"]
        assert parse_message(shown["emoji"]).ok, shown  # the grammar held
        answer = game.answer_guess(shown["round_id"], 1, "pizza tonight")
        expected = Similarity(embedder).similarity(["Let's grab pizza tonight"], ["pizza tonight"])[0]
        assert answer["similarity"] == pytest.approx(expected, abs=1e-5)
        (row,) = game.store.answers()
        assert (row["target_id"], row["sender"], row["adapter"]) == ("c1", "base", None)
    finally:
        game.close()
