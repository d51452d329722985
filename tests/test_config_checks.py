"""Config values checked where they are parsed (issue 34, points 3 and 5): a wrong type or an
impossible value names its key (and its file) before any model loads, instead of failing deep in a
library, or running a game that never ends."""

from __future__ import annotations

import re

import pytest

from emoji_rl import chat, play_game
from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.play.evaluate import config_class
from emoji_rl.rl import train_config
from emoji_rl.sft import trl_config as sft

RETRIEVAL = config_class("retrieval")  # `eval --game retrieval`'s Config


def parse(cls, tmp_path, yaml_text: str, *argv: str):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    return parse_config(cls, ["--config", str(path), *argv], prog="test")


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("max_steps: 2.5\n", "max_steps must be a whole number, got 2.5"),
        ("max_steps: [1, 2]\n", "max_steps must be a whole number, got [1, 2]"),
        ("max_steps: true\n", "max_steps must be a whole number, got True"),
        ("learning_rate: .nan\n", "learning_rate must be a finite number, got nan"),
        ("learning_rate: .inf\n", "learning_rate must be a finite number, got inf"),
        ("learning_rate: fast\n", "learning_rate must be a finite number, got 'fast'"),
        ("resume: maybe\n", "resume must be true or false, got 'maybe'"),
        ("engine: tgi\n", "engine must be one of hf, vllm, got 'tgi'"),
        ("output_dir: 3\n", "output_dir must be text (quote it), got 3"),
        ("max_steps:\n", "max_steps is empty"),
    ],
)
def test_a_yaml_value_of_the_wrong_type_names_its_file_and_key(tmp_path, yaml_text, message):
    with pytest.raises(UserError, match="config file .*c.yaml: " + re.escape(message)):
        parse(train_config.config_class("retrieval"), tmp_path, yaml_text)


def test_yaml_numbers_are_taken_as_their_fields_type(tmp_path):
    cfg = parse(
        train_config.config_class("retrieval"), tmp_path, "learning_rate: 1e-4\nbeta: 0\nmax_steps: 3\n"
    )
    assert cfg.learning_rate == 1e-4 and isinstance(cfg.beta, float) and cfg.max_steps == 3


def test_a_list_field_given_one_value_says_to_make_it_a_list(tmp_path):
    with pytest.raises(UserError, match=r"systems must be a list, e\.g\. systems: \['base'\], got 'base'"):
        parse(RETRIEVAL, tmp_path, "systems: base\n")


def test_a_non_finite_number_on_the_command_line_is_refused():
    with pytest.raises(UserError, match="argument --learning_rate: expected a finite number, got 'nan'"):
        parse_config(train_config.config_class("retrieval"), ["--learning_rate", "nan"], prog="grpo")


@pytest.mark.parametrize(
    ("cls", "argv", "message"),
    [
        (train_config.config_class("retrieval"), ["--max_turns", "0"], "max_turns=0 must be >= 1"),
        (RETRIEVAL, ["--max_turns", "-1"], "max_turns=-1 must be >= 1"),
        (play_game.Config, ["--max_turns", "0"], "max_turns=0 must be >= 1"),
        (play_game.Config, ["--temperature", "-1"], "temperature=-1.0 must be >= 0.0"),
        (chat.Config, ["--temperature", "-1"], "temperature=-1.0 must be >= 0.0"),
        (RETRIEVAL, ["--judge_temperature", "-0.5"], "judge_temperature=-0.5 must be >= 0.0"),
        # A checkpoint every 0 steps divides by zero after a whole step; TRL has no -1 for it.
        (train_config.config_class("retrieval"), ["--save_steps", "0"], "save_steps=0 must be >= 1"),
        (train_config.config_class("wordle"), ["--save_steps", "-1"], "save_steps=-1 must be >= 1"),
        (sft.Config, ["--save_steps", "0"], "save_steps=0 must be >= 1"),
        (sft.Config, ["--save_steps", "-1"], "save_steps=-1 must be >= 1"),
        # A cosine similarity is in [-1, 1]: above, no guess ends a game or succeeds.
        (train_config.config_class("reader"), ["--tau", "2"], "tau=2.0 must be <= 1.0"),
        (train_config.config_class("retrieval"), ["--tau", "1.5"], "tau=1.5 must be <= 1.0"),
        (RETRIEVAL, ["--tau", "-2"], "tau=-2.0 must be >= -1.0"),
    ],
)
def test_values_no_game_can_run_with_are_refused_at_parse_time(cls, argv, message):
    with pytest.raises(UserError, match=message):
        parse_config(cls, argv, prog="test")


def test_a_bound_broken_in_the_config_file_names_the_file(tmp_path):
    with pytest.raises(
        UserError, match=r"max_turns=0 must be >= 1 \(--max_turns, or max_turns: in .*c\.yaml\)"
    ):
        parse(RETRIEVAL, tmp_path, "max_turns: 0\n")


def test_chat_refuses_an_empty_message():
    with pytest.raises(UserError, match="an empty message has nothing to say"):
        parse_config(chat.Config, ["--message", "hello", " "], prog="chat")


@pytest.mark.parametrize(("k", "keep"), [(0, 2), (1, 2), (2, 3), (4, 5)])
def test_the_adapter_versions_kept_follow_max_off_policy_steps_unless_set(k, keep):
    # launch/train_grpo.sh passes MAX_OFF_POLICY_STEPS as --max_off_policy_steps alone: the versions
    # kept must follow it, as the policy server's --max-loras max(2, K+1) does.
    argv = ["--engine", "vllm", "--max_off_policy_steps", str(k)]
    assert parse_config(train_config.config_class("retrieval"), argv, prog="grpo").vllm_adapter_keep == keep
    kept = parse_config(
        train_config.config_class("retrieval"), [*argv, "--vllm_adapter_keep", "6"], prog="grpo"
    )
    assert kept.vllm_adapter_keep == 6


def test_adapter_versions_kept_set_below_the_versions_in_use_are_refused():
    argv = ["--engine", "vllm", "--max_off_policy_steps", "2", "--vllm_adapter_keep", "2"]
    with pytest.raises(
        UserError, match=re.escape("vllm_adapter_keep=2 must be >= max_off_policy_steps + 1 = 3")
    ):
        parse_config(train_config.config_class("retrieval"), argv, prog="grpo")
