"""`emoji-rl eval-reader` end to end on the embedded models: the base and an adapter read the teacher's
emoji for three held-out messages, the base model adds emoji after a guess below tau; rows, paired
comparisons against the base, records, the PNG; a bad record is named. (A rerun's reuse of the log is
the shared path's, tested in tests/play/test_evaluate.py.)"""

import json

import pytest

from emoji_rl import cli
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import DataError
from emoji_rl.play.evaluate import config_class
from emoji_rl.play.registry import load

MESSAGES = {
    "Let's get pizza and watch a movie tonight": "🍕 🎬 🌃",
    "I am so tired after a long day at work": "😫 💼",
    "The train is late again": "🚆 ⏰",
}

Config = config_class("reader")  # `eval --game reader`'s


def split(path, messages=MESSAGES):
    """A held-out SFT split as `emoji-rl teacher` writes it."""
    records = [
        {"id": f"m{i}", "target": t, "messages": [*sender_messages(t), {"role": "assistant", "content": e}]}
        for i, (t, e) in enumerate(messages.items())
    ]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return str(path)


def test_the_reader_game_has_its_evaluation_and_compares_each_adapter_with_the_base():
    assert load("reader").evaluation is not None
    cfg = Config(systems=["base", "a=x", "b=y"])
    assert cfg.compare == ["a:base", "b:base"]
    assert Config(systems=["a=x", "b=y"]).compare == []  # no base: the path's adjacent pairs
    with pytest.raises(Exception, match="partner_url and partner_model"):
        Config(partner="openai")


@pytest.mark.slow
def test_eval_reader_plays_base_and_an_adapter_and_compares_them(tmp_path, capsys, noisy_adapter):
    out = tmp_path / "report"
    argv = ["eval-reader", "--data", split(tmp_path / "sft_test.jsonl"), "--output_dir", str(out)]
    argv += ["--systems", "base", f"noisy={noisy_adapter}", "--max_turns", "2", "--tau", "0.99"]
    argv += ["--max_new_tokens", "16", "--partner_max_new_tokens", "24", "--contrast_messages", "2"]
    assert cli.main(argv) == 0
    report = json.loads((out / "reader.json").read_text())
    assert [(r["system"], r["mode"], r["n"]) for r in report["rows"]] == [
        ("base", "multi", 3),
        ("noisy", "multi", 3),
    ]
    for row in report["rows"]:
        assert -1.0 <= row["first_similarity"] <= 1.0 and 1.0 <= row["turns"] <= 2.0
        assert row["similarity_lo"] <= row["similarity"] <= row["similarity_hi"]
    assert {(c["a"], c["b"], c["metric"]) for c in report["comparisons"]} == {
        ("noisy", "base", m) for m in ("similarity", "first_similarity", "reward")
    }
    assert report["sender"].startswith("hf(") and report["contrast"] == 1.0
    for record in report["records"]:
        assert record["target"] in MESSAGES and 1 <= len(record["turns"]) <= 2
        first = record["turns"][0]
        assert first["emoji"] == MESSAGES[record["target"]] and isinstance(first["guess"], str)
        # tau 0.99: a second turn came unless the sender's answer was no emoji message
        assert len(record["turns"]) == 2 or record["metrics"]["partner_failed"] == 1.0
        assert record["reward"] == pytest.approx(record["similarity"] - record["metrics"]["background"])
    assert (out / "reader.png").stat().st_size > 0
    assert "first_similarity" in capsys.readouterr().out


def test_a_held_out_record_without_the_teachers_emoji_is_named_by_line(tmp_path):
    path = tmp_path / "sft_test.jsonl"
    split(path)
    lines = path.read_text().splitlines()
    lines[1] = json.dumps({"id": "m1", "target": "hello there", "messages": []})
    path.write_text("\n".join(lines) + "\n")
    from emoji_rl.games.reader.records import read_reader_records

    with pytest.raises(DataError, match=r":2: .*no assistant turn"):
        read_reader_records(str(path), 2, 8)
