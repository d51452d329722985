"""eval-sft's checks and helpers that need no model; the end-to-end run is in test_train.py."""

import json

import pytest

from emoji_rl import cli
from emoji_rl.errors import UserError
from emoji_rl.play.judge import LexiconJudge
from emoji_rl.sft.data import ChatRecord
from emoji_rl.sft.evaluate import Config, base_model_of, judge_similarity, targets_of


def test_adapter_is_required(capsys):
    assert cli.main(["eval-sft"]) == 2
    err = capsys.readouterr().err
    assert "--adapter is required" in err and "Traceback" not in err


def test_unknown_decoding_is_an_error():
    with pytest.raises(ValueError, match=r"decodings \['beam'\] invalid"):
        Config(adapter="a", decodings=["none", "beam"])


def test_base_model_comes_from_the_adapter_config(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/base"}))
    assert base_model_of(tmp_path) == "org/base"
    with pytest.raises(UserError, match=r"has no adapter_config\.json"):
        base_model_of(tmp_path / "missing")


def test_judge_similarity_needs_targets(tmp_path):
    record = ChatRecord(({"role": "user", "content": "hi"}, {"role": "assistant", "content": "👋 😊"}), None)
    with pytest.raises(UserError, match="1 record\\(s\\) have no `target`"):
        targets_of([record], "test.jsonl")


class _Identity:
    """A stand-in for `Similarity`: 1.0 when the guess names the target, else 0.0."""

    def similarity(self, targets, guesses):
        return [float(t in g) for t, g in zip(targets, guesses, strict=True)]


def test_judge_similarity_scores_compliant_replies_only():
    messages = [("🍕", "🎬"), None, ("☔", "🐱")]
    # the lexicon judge guesses "pizza, clapper board" and "umbrella with rain drops, cat face"
    assert judge_similarity(LexiconJudge(), _Identity(), ["pizza", "cat", "dog"], messages) == 0.5
    assert judge_similarity(LexiconJudge(), _Identity(), ["x"], [None]) is None
