"""GRPO's held-out evaluation: its metric names, a run's of before #62 read under today's, and its
records checked before any model loads or anything is written."""

from __future__ import annotations

import json

import pytest

from emoji_rl import cli
from emoji_rl.io.metrics import folder_clashes
from emoji_rl.rl import train as grpo_train
from emoji_rl.rl.held_out import current_names, eval_name


def test_the_reward_and_its_terms_are_named_as_the_training_line_names_them():
    keys = ["reward", "reward/contrast", "reward/total", "similarity", "success@0.5", "retrieval@1/10"]
    names = [eval_name(key) for key in keys]
    assert names == [
        "eval/reward/mean",
        "eval/reward/contrast/mean",
        "eval/reward/total/mean",
        "eval/similarity",
        "eval/success@0.5",
        "eval/retrieval@1/10",
    ]
    assert folder_clashes(names) == []


def test_a_line_of_before_the_rename_is_read_under_todays_names():
    old = {
        "step": 2,
        "reward/mean": 0.5,
        "eval/reward": 0.25,
        "eval/reward/contrast": -0.1,
        "eval/turns": 1.0,
    }
    new = {"step": 2, "reward/mean": 0.5, "eval/reward/mean": 0.25, "eval/reward/contrast/mean": -0.1}
    assert current_names(old) == {**new, "eval/turns": 1.0}
    assert current_names(new) == new  # today's line, and one without an evaluation, stay as they are
    assert current_names({"step": 1, "reward/mean": 0.5}) == {"step": 1, "reward/mean": 0.5}


class ModelLoads(Exception):
    """The stage got as far as loading a model."""


def _models_must_not_load(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise ModelLoads

    monkeypatch.setattr(grpo_train.models, "load_tokenizer", refuse)


BAD_EVAL_DATA = {
    # A missing input is named by the stage's check of every input field (cli), before the game reads it.
    "missing": (None, "no such file or directory: eval_data="),
    "a folder": ("folder", "is a folder, not a file of records"),
    "malformed": ('{"target": "a"}\n{"target": \n', ":2: not valid JSON"),
    "empty": ("\n", "holds no records: make it with `emoji-rl rl-prompts`"),
    "another game's": ('{"answer": "crane"}\n', ":1: record has no non-empty string `target`"),
}


@pytest.mark.parametrize("bad", BAD_EVAL_DATA)
def test_eval_data_is_checked_before_any_model_loads_and_a_corrected_rerun_is_taken(
    tmp_path, monkeypatch, capsys, bad
):
    """Refused naming eval_data, with the run directory left as it was (none): the corrected command is
    then not taken for a run to resume, and goes on to load the models."""
    _models_must_not_load(monkeypatch)
    data, eval_data, out = tmp_path / "rl.jsonl", tmp_path / "rl_eval.jsonl", tmp_path / "run"
    data.write_text(json.dumps({"target": "the cat sleeps"}) + "\n")
    content, message = BAD_EVAL_DATA[bad]
    if content == "folder":
        eval_data.mkdir()
    elif content is not None:
        eval_data.write_text(content)
    argv = ["grpo", "--train_data", str(data), "--judge", "lexicon", "--output_dir", str(out)]
    argv += ["--eval_steps", "5", "--report_to", "tensorboard", "wandb", "trackio", "mlflow"]
    assert cli.main([*argv, "--eval_data", str(eval_data)]) == 2
    err = capsys.readouterr().err
    named = f"eval_data={eval_data}" if content is None else f"eval_data: {eval_data}"
    assert "emoji-rl grpo: error: " in err and named in err and message in err
    assert not out.exists()

    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"target": "we missed the train"}) + "\n")
    with pytest.raises(ModelLoads):
        cli.main([*argv, "--eval_data", str(good)])
