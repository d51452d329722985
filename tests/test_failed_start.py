"""A training stage that fails its own input check leaves nothing in the way: no config.yaml, no lock,
no directory it made, so the corrected rerun starts fresh rather than being taken for a run to resume."""

from __future__ import annotations

import json

import pytest

from emoji_rl import cli

STAGES = {
    "sft": ["sft", "--config", "configs/cpu/sft.yaml", "--eval_data", "none"],
    "grpo": ["grpo", "--config", "configs/cpu/grpo.yaml", "--judge", "lexicon", "--init_adapter", "none"],
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_typo_in_train_data_leaves_no_run_behind(stage, tmp_path, capsys):
    run = tmp_path / "runs" / stage
    typo = tmp_path / "trian.jsonl"
    assert (
        cli.main([*STAGES[stage], "--train_data", str(typo), "--output_dir", str(run), "--max_steps", "1"])
        == 2
    )
    assert str(typo) in capsys.readouterr().err
    assert not run.exists() and not run.parent.exists()  # both made by the stage, both gone

    # A directory that was there before stays, emptied of what the failed stage wrote.
    run.mkdir(parents=True)
    assert (
        cli.main([*STAGES[stage], "--train_data", str(typo), "--output_dir", str(run), "--max_steps", "1"])
        == 2
    )
    assert run.is_dir() and [p.name for p in run.iterdir() if p.name != ".lock"] == []


def test_the_corrected_grpo_rerun_is_not_refused(tmp_path, capsys):
    run = tmp_path / "run"
    data = tmp_path / "rl.jsonl"
    data.write_text(json.dumps({"target": "the cat sleeps"}) + "\n")
    small = ["--output_dir", str(run), "--max_steps", "1", "--batch_size", "1", "--group_size", "2"]
    small += ["--max_turns", "1", "--max_new_tokens", "4", "--report_to", "none"]
    assert cli.main([*STAGES["grpo"], "--train_data", str(tmp_path / "trian.jsonl"), *small]) == 2
    assert cli.main([*STAGES["grpo"], "--train_data", str(data), *small]) == 0
    assert (run / "adapter" / "adapter_config.json").is_file()
