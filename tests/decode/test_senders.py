"""The senders' registry: systems as every evaluation names them, and the teacher's answers."""

import json

import pytest

from emoji_rl.decode import senders
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import DataError


def test_systems_parse_and_reject_bad_specs():
    # Model senders, as eval-wordle and play-web read them too.
    assert senders.parse_systems(["base", "sft=runs/sft/adapter"]) == {
        "base": None,
        "sft": "runs/sft/adapter",
    }
    systems = senders.eval_systems(["base", "sft=runs/sft/adapter", "teacher=data/sft_train.jsonl", "random"])
    assert systems == {
        "base": senders.System("base", "base"),
        "sft": senders.System("sft", "adapter", "runs/sft/adapter"),
        "teacher": senders.System("teacher", "teacher", "data/sft_train.jsonl"),
        "random": senders.System("random", "random"),
    }
    assert [s.fixed for s in systems.values()] == [False, False, True, True]
    with pytest.raises(ValueError, match="NAME=ADAPTER_DIR"):
        senders.eval_systems(["sft"])
    for twice in (["a=x", "a=y"], ["random", "random"], ["teacher=a.jsonl", "teacher=b.jsonl"]):
        with pytest.raises(ValueError, match="appears twice"):
            senders.eval_systems(twice)


def test_teacher_answers_are_the_last_assistant_turn_matched_by_target(tmp_path):
    path = tmp_path / "sft_train.jsonl"
    path.write_text(
        json.dumps(
            {"target": "pizza tonight", "messages": [*sender_messages("pizza tonight"), ANSWER("🍕 🌙")]}
        )
        + "\n"
    )
    assert senders.teacher_answers(str(path), ["no such message", "pizza tonight"]) == [None, "🍕 🌙"]
    path.write_text(json.dumps({"target": "pizza tonight", "messages": []}) + "\n")
    with pytest.raises(DataError, match=r"sft_train\.jsonl:1"):
        senders.teacher_answers(str(path), ["pizza tonight"])


def ANSWER(emoji):
    return {"role": "assistant", "content": emoji}
