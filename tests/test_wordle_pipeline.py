"""configs/{cpu,gpu}/wordle.yaml (`make wordle`): every command line parses with its stage's own
config parser, launch scripts' included (their --dry-run command), and each stage reads what the
one before it wrote."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from tests.test_launch import dry_run, parse_stage, split_env, stage_commands

from emoji_rl.cli import STAGES

ROOT = Path(__file__).resolve().parents[1]


def stage_configs(profile: str):
    """(stage name, the emoji-rl stage it runs, its parsed Config) for each line of the file."""
    spec = yaml.safe_load((ROOT / "configs" / profile / "wordle.yaml").read_text())
    run_dir = spec["run_dir"]
    for stage in spec["stages"]:
        argv = shlex.split(stage["run"].replace("{run_dir}", run_dir))
        if argv[0] in STAGES:
            yield stage["name"], argv[0], parse_stage(argv[0], argv[1:])
            continue
        env, command = split_env(argv)
        assert command[:2] == ["bash", f"launch/{Path(command[1]).name}"], command
        [(name, args)] = [
            c
            for line in dry_run(Path(command[1]).name, *command[2:], GPUS="8", **env)
            for c in stage_commands(line)
        ]
        yield stage["name"], name, parse_stage(name, args)


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_wordle_stage_parses_and_reads_what_the_one_before_wrote(profile, monkeypatch):
    monkeypatch.chdir(ROOT)  # config files are named from the repository root
    stages = list(stage_configs(profile))
    assert [(name, stage) for name, stage, _ in stages] == [
        ("wordle-data", "wordle-data"),
        ("sft", "sft"),
        ("grpo", "grpo"),
        ("eval-wordle", "eval-wordle"),
    ]
    data, sft, grpo, evaluation = (cfg for _, _, cfg in stages)
    assert sft.train_data == f"{data.output_dir}/wordle_sft_train.jsonl" and sft.eval_data is None
    assert grpo.game == "wordle" and grpo.init_adapter == f"{sft.output_dir}/adapter"
    assert grpo.train_data == f"{data.output_dir}/wordle_rl_train.jsonl"
    assert evaluation.data == f"{data.output_dir}/wordle_rl_eval.jsonl" and evaluation.solver
    assert evaluation.systems == ["base", f"sft={sft.output_dir}/adapter", f"rl={grpo.output_dir}/adapter"]
    assert sft.model == grpo.model == evaluation.model
