"""The evaluation stages' outputs, byte for byte, against what they wrote before `eval --game NAME`
replaced them (#60): eval-retrieval, eval-wordle and eval-reader on tiny fixed-seed configs, each file
they write (NAME.json, NAME_records.jsonl, NAME.png) and what they print, equal to
tests/fixtures/eval_outputs/. Retrieval and the reader run as `eval --game NAME`, Wordle as its old
spelling, `eval-wordle` (an alias parses to the same config as `eval --game NAME`: tests/test_cli.py).

The similarity model is a fake whose vectors hold four entries of 0.5 (a text's first words, hashed),
so every similarity is a multiple of 0.25, exact in any order of summation: the files are the same
under every ATEN_CPU_CAPABILITY. The models that play (SmolLM2, greedy) write text, which the games
score exactly. `EMOJI_RL_WRITE_FIXTURES=1` rewrites the fixtures (only for a change meant to change them)."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

from emoji_rl import cli
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.lm import models

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent.parent / "fixtures" / "eval_outputs"
DIM = 64


class ExactEmbedder:
    """A stand-in sentence embedder: a text's first four distinct words (padded with fixed ones), each
    hashed to a dimension set to 0.5 (a collision adds): unit-norm where they differ, every dot product
    a multiple of 0.25."""

    def get_embedding_dimension(self) -> int:
        return DIM

    def encode(self, texts, **_) -> torch.Tensor:
        rows = torch.zeros(len(texts), DIM)
        for row, text in zip(rows, texts, strict=True):
            words = list(dict.fromkeys(re.findall(r"\w+", text.lower())))[:4]
            for word in [*words, *("_a", "_b", "_c", "_d")][:4]:
                row[int(hashlib.sha256(word.encode()).hexdigest(), 16) % DIM] += 0.5
        return rows


TARGETS = [
    "let's get pizza tonight",
    "the train is late again",
    "happy birthday to my sister",
    "I lost my keys at the beach",
    "we are going to the cinema",
]
TEACHER = ["🍕 🌙", "🚆 ⏰", "🎂 👧 🎉", "🔑 🏖️", None]


def _lines(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def _split(messages: list[tuple[str, str]]) -> list[dict]:
    return [
        {"id": f"m{i}", "target": t, "messages": [*sender_messages(t), {"role": "assistant", "content": e}]}
        for i, (t, e) in enumerate(messages)
    ]


def retrieval_inputs() -> list[str]:
    _lines(Path("rl_eval.jsonl"), [{"id": f"m{i}", "target": t} for i, t in enumerate(TARGETS)])
    _lines(Path("sft_train.jsonl"), _split([(t, e) for t, e in zip(TARGETS, TEACHER, strict=True) if e]))
    args = ["--systems", "base", "teacher=sft_train.jsonl", "random", "--data", "rl_eval.jsonl"]
    args += ["--judge", "lexicon", "--distractors", "3", "--max_turns", "2", "--max_new_tokens", "8"]
    return [*args, "--reference_examples", "2", "--batch_size", "2", "--resamples", "50", "--seed", "3"]


def wordle_inputs() -> list[str]:
    _lines(
        Path("answers.jsonl"), [{"id": "w-above", "answer": "above"}, {"id": "w-speed", "answer": "speed"}]
    )
    args = ["--data", "answers.jsonl", "--max_turns", "2", "--max_new_tokens", "10"]
    return [*args, "--resamples", "50", "--seed", "3"]


def reader_inputs() -> list[str]:
    _lines(Path("sft_test.jsonl"), _split([(t, e) for t, e in zip(TARGETS[:3], TEACHER[:3], strict=True)]))
    args = ["--data", "sft_test.jsonl", "--max_turns", "2", "--tau", "0.99", "--max_new_tokens", "8"]
    return [*args, "--partner_max_new_tokens", "12", "--contrast_messages", "2", "--resamples", "50"]


GAMES = {"retrieval": retrieval_inputs, "wordle": wordle_inputs, "reader": reader_inputs}
SPELLINGS = {
    "retrieval": ["eval", "--game", "retrieval"],
    "wordle": ["eval-wordle"],
    "reader": ["eval", "--game", "reader"],
}


def outputs(out: Path, printed: str) -> dict[str, bytes]:
    """Every file the stage wrote, and what it printed with the seconds each row took taken out."""
    files = {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.name != ".lock"}
    return {**files, "stdout.txt": re.sub(r"played in \d+ s", "played in N s", printed).encode()}


@pytest.mark.parametrize("game", GAMES)
def test_an_evaluation_writes_what_it_wrote_before_eval_game(game, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(models, "load_embedder", lambda *args, **kwargs: ExactEmbedder())
    args = GAMES[game]()
    expected = FIXTURES / game
    assert cli.main([*SPELLINGS[game], *args, "--output_dir", "out"]) == 0
    written = outputs(Path("out"), capsys.readouterr().out.replace("out/", "OUT/"))
    if os.environ.get("EMOJI_RL_WRITE_FIXTURES") == "1":
        expected.mkdir(parents=True, exist_ok=True)
        for name, data in written.items():
            (expected / name).write_bytes(data)
    assert sorted(written) == sorted(p.name for p in expected.iterdir())
    for name, data in written.items():
        assert data == (expected / name).read_bytes(), f"{name} differs from {expected / name}"
