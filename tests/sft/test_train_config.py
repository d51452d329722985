"""The sft stage's config: TRL settings, bad keys, batch arithmetic, resume rules, metric lines. No model."""

import json
import logging
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from emoji_rl import cli
from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.io.metrics import MetricsWriter
from emoji_rl.io.trackers import TrackerConfig
from emoji_rl.lm.models import Runtime
from emoji_rl.sft.callbacks import metrics_callback
from emoji_rl.sft.loss import logged_loss_sum, whole_run_loss
from emoji_rl.sft.resume import checkpoint_to_resume
from emoji_rl.sft.trl_config import Config, accumulation_steps, build_sft_config

ROOT = Path(__file__).resolve().parents[2]
CPU = Runtime("cpu", torch.float32, "sdpa")


def test_cpu_sft_config_is_fp32_without_checkpointing_and_completion_only(tmp_path):
    args = build_sft_config(Config(output_dir=str(tmp_path)), CPU, world_size=1)
    # SFTConfig defaults bf16=True even on a CPU (docs/DESIGN.md §5): it must be off explicitly.
    assert args.bf16 is False and args.use_cpu is True
    assert args.gradient_checkpointing is False
    assert args.completion_only_loss is True
    assert (args.learning_rate, args.adam_beta1, args.adam_beta2) == (5e-4, 0.9, 0.95)
    assert args.lr_scheduler_type == "linear"
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps == 128


def test_effective_batch_is_kept_across_process_counts():
    cfg = Config(per_device_train_batch_size=16, effective_batch_size=128)
    assert [accumulation_steps(cfg, n) for n in (1, 2, 8)] == [8, 4, 1]
    with pytest.raises(
        UserError, match=r"not a multiple of per_device_train_batch_size=16 x 3 process\(es\) = 48"
    ):
        accumulation_steps(cfg, 3)
    assert accumulation_steps(Config(effective_batch_size=None, gradient_accumulation_steps=5), 2) == 5


def test_setting_both_batch_knobs_is_an_error():
    with pytest.raises(ValueError, match="both set the batch"):
        Config(effective_batch_size=64, gradient_accumulation_steps=2)


def test_a_field_trl_does_not_know_is_a_clear_error():
    with pytest.raises(UserError, match=r"'warmup_ratioo' is not a field of TRL's SFTConfig; did you mean"):
        build_sft_config(Config(sft_overrides=["warmup_ratioo=0.1"]), CPU, world_size=1)


def test_a_field_this_stage_sets_cannot_be_overridden():
    with pytest.raises(UserError, match="'bf16' is set by this stage"):
        build_sft_config(Config(sft_overrides=["bf16=true"]), CPU, world_size=1)
    with pytest.raises(UserError, match="not KEY=VALUE"):
        build_sft_config(Config(sft_overrides=["optim"]), CPU, world_size=1)


def test_other_trl_fields_pass_through_parsed_as_yaml():
    args = build_sft_config(Config(sft_overrides=["optim=adamw_torch", "torch_empty_cache_steps=7"]), CPU, 1)
    assert (args.optim, args.torch_empty_cache_steps) == ("adamw_torch", 7)


def test_trl_rejecting_a_value_is_a_user_error():
    with pytest.raises(UserError, match="TRL's SFTConfig rejected the settings"):
        build_sft_config(Config(sft_overrides=["optim=no_such_optimizer"]), CPU, world_size=1)


def test_unknown_yaml_key_is_an_error_naming_it(tmp_path, capsys):
    path = tmp_path / "sft.yaml"
    path.write_text("lora_rank: 8\n")
    assert cli.main(["sft", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown key(s) lora_rank" in err and "lora_r" in err and "Traceback" not in err


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_profile_configs_parse(profile):
    path = ROOT / "configs" / profile / "sft.yaml"
    cfg = parse_config(Config, ["--config", str(path)], prog="emoji-rl sft")
    assert set(yaml.safe_load(path.read_text())) <= set(vars(cfg))
    build_sft_config(cfg, CPU, world_size=1)


def test_gpu_wordle_sft_recomputes_activations():
    # A forward holds 16 rows of up to 1,057 tokens through Qwen3.5-4B.
    path = ROOT / "configs" / "gpu" / "sft.wordle.yaml"
    cfg = parse_config(Config, ["--config", str(path)], prog="emoji-rl sft")
    args = build_sft_config(cfg, CPU, world_size=1)
    assert args.activation_checkpointing is True
    assert args.activation_checkpointing_kwargs == {"use_reentrant": False}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_accelerate_configs_are_valid(strategy):
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser

    config = ClusterConfig.from_yaml_file(ROOT / "configs" / "accelerate" / f"{strategy}.yaml")
    assert config.distributed_type.value == {"ddp": "MULTI_GPU", "fsdp": "FSDP"}[strategy]
    # accelerate turns fsdp_config keys into launch flags; a misspelt key would be dropped silently.
    launch_flags = {action.dest for action in launch_command_parser()._actions}
    assert set(config.fsdp_config) <= launch_flags


def test_launch_script_dry_run_prints_the_command():
    result = subprocess.run(
        [str(ROOT / "launch" / "train_sft.sh"), "--dry-run", "--max_steps", "10"],
        env={"PATH": "/usr/bin:/bin", "NGPUS": "4", "STRATEGY": "fsdp"},
        capture_output=True,
        text=True,
        check=True,
    )
    command = result.stdout.split()
    assert command[1:3] == ["-m", "accelerate.commands.launch"]
    assert "configs/accelerate/fsdp.yaml" in command and "--num_processes" in command
    assert command[command.index("--num_processes") + 1] == "4"
    assert command[-5:] == ["sft", "--config", "configs/gpu/sft.yaml", "--max_steps", "10"]


def test_resume_without_a_checkpoint_starts_over_and_a_fresh_run_refuses_one(tmp_path):
    assert checkpoint_to_resume(tmp_path / "new", resume=False) is None
    assert checkpoint_to_resume(tmp_path / "new", resume=True) is None
    (tmp_path / "metrics.jsonl").write_text("")  # what a run that died before its first checkpoint left
    assert checkpoint_to_resume(tmp_path, resume=True) is None
    for step in (4, 12):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    assert checkpoint_to_resume(tmp_path, resume=True) == str(tmp_path / "checkpoint-12")
    with pytest.raises(UserError, match="already holds checkpoint-12: pass --resume true"):
        checkpoint_to_resume(tmp_path, resume=False)


def test_a_checkpoint_whose_save_was_cut_short_is_set_aside_and_the_one_before_used(tmp_path, caplog):
    whole = tmp_path / "checkpoint-4"
    whole.mkdir()
    (whole / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    cut = tmp_path / "checkpoint-12"  # what a kill -9 during the save left: no trainer state
    cut.mkdir()
    (cut / "README.md").write_text("adapter card")
    (cut / ".tmp_adapter_model.safetensors").write_bytes(b"\0" * 10)
    torn = tmp_path / "checkpoint-8"  # killed while writing the trainer state itself
    torn.mkdir()
    (torn / "trainer_state.json").write_text('{"global_st')
    assert checkpoint_to_resume(tmp_path, resume=True, is_main=False) == str(whole)
    assert cut.is_dir() and torn.is_dir()  # only the main process moves them
    with caplog.at_level(logging.WARNING):
        assert checkpoint_to_resume(tmp_path, resume=True) == str(whole)
    assert (
        "checkpoint-12 was not saved whole" in caplog.text
        and "set aside as incomplete-save-12" in caplog.text
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-4",
        "incomplete-save-12",
        "incomplete-save-8",
    ]
    assert (tmp_path / "incomplete-save-12" / "README.md").is_file()  # kept, for a look


def test_metrics_callback_appends_one_json_line_per_log(tmp_path):
    from transformers import TrainerState

    path = tmp_path / "metrics.jsonl"
    state = TrainerState(global_step=3)
    with MetricsWriter(tmp_path, trackers=TrackerConfig(report_to=["none"])) as writer:
        callback = metrics_callback(writer)
        callback.on_log(None, state, None, logs={"loss": 1.5, "epoch": 0.5})
        callback.on_log(None, state, None, logs={"eval_loss": 1.25})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # Named as TensorBoard, wandb and trackio name them, the epoch included.
    assert lines == [{"step": 3, "train/loss": 1.5, "train/epoch": 0.5}, {"step": 3, "eval/loss": 1.25}]


def test_a_resumed_runs_train_loss_is_the_mean_over_all_its_steps():
    # Lines every 2 steps: mean 3.0 over steps 1-2, 2.0 over 3-4, then an eval line (no loss).
    history = [{"loss": 3.0, "step": 2}, {"loss": 2.0, "step": 4}, {"eval_loss": 9.0, "step": 4}]
    assert logged_loss_sum(history, 4) == 3.0 * 2 + 2.0 * 2
    assert logged_loss_sum(history, 3) == 6.0  # step 4's line is after the checkpoint at 3
    # Resumed at step 4 (sum 10), the Trainer's own train() took steps 5-6 at a mean of 1.0:
    # the run's mean is (10 + 2) / 6, not the call's 1.0.
    assert whole_run_loss(10.0, 4, 1.0, 6) == 2.0
    assert whole_run_loss(10.0, 4, 0.0, 4) == 2.5  # resumed at its last step: nothing trained
    assert whole_run_loss(0.0, 0, 1.5, 6) == 1.5  # a fresh run's is the Trainer's own
