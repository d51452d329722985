from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from emoji_rl.config import override, parse_config, peek, save_config
from emoji_rl.errors import UserError


@dataclass
class Toy:
    """A toy stage."""

    learning_rate: float = field(default=1e-4, metadata={"help": "step size"})
    group_size: int = field(default=4, metadata={"help": "rollouts per prompt"})
    engine: Literal["hf", "vllm"] = field(default="hf", metadata={"help": "rollout engine"})
    resume: bool = field(default=False, metadata={"help": "resume from the last checkpoint"})
    adapter: str | None = field(default=None, metadata={"help": "adapter dir"})
    judge: Literal["hf", "lexicon"] | None = field(default=None, metadata={"help": "judge kind"})
    messages: list[str] | None = field(default=None, metadata={"help": "messages"})

    def __post_init__(self) -> None:
        if self.group_size < 2:
            raise ValueError(f"group_size={self.group_size} must be >= 2")


def test_defaults_then_yaml_then_cli(tmp_path):
    path = tmp_path / "toy.yaml"
    path.write_text("learning_rate: 0.5\ngroup_size: 8\n")
    cfg = parse_config(Toy, ["--config", str(path), "--group_size", "16"], prog="toy")
    assert cfg.learning_rate == 0.5  # from YAML
    assert cfg.group_size == 16  # CLI wins over YAML
    assert cfg.engine == "hf"  # default


def test_types_are_parsed():
    cfg = parse_config(
        Toy, ["--engine", "vllm", "--resume", "true", "--adapter", "none", "--messages", "a", "b"], prog="toy"
    )
    assert (cfg.engine, cfg.resume, cfg.adapter, cfg.messages) == ("vllm", True, None, ["a", "b"])


def test_bare_bool_flag_means_true_and_false_still_turns_it_off(tmp_path):
    assert parse_config(Toy, ["--resume", "--engine", "vllm"], prog="toy").resume is True
    path = tmp_path / "toy.yaml"
    path.write_text("resume: true\n")
    assert parse_config(Toy, ["--config", str(path), "--resume", "false"], prog="toy").resume is False
    with pytest.raises(UserError, match="argument --resume: expected true or false, got 'maybe'"):
        parse_config(Toy, ["--resume", "maybe"], prog="toy")


def test_optional_choice_takes_none():
    assert parse_config(Toy, ["--judge", "none"], prog="toy").judge is None
    assert parse_config(Toy, ["--judge", "lexicon"], prog="toy").judge == "lexicon"
    with pytest.raises(UserError, match="argument --judge: invalid choice: 'gpt'"):
        parse_config(Toy, ["--judge", "gpt"], prog="toy")


def test_unknown_yaml_key_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("learning_rat: 0.5\n")
    with pytest.raises(
        UserError, match=r"bad.yaml: unknown key\(s\) learning_rat .*valid keys: .*learning_rate"
    ):
        parse_config(Toy, ["--config", str(path)], prog="toy")


def test_an_unknown_flag_and_a_bad_choice_are_one_line_errors_without_the_usage(capsys):
    with pytest.raises(UserError, match=r"^unrecognized arguments: --learning_rat 1 \(`toy --help` lists"):
        parse_config(Toy, ["--learning_rat", "1"], prog="toy")
    with pytest.raises(
        UserError, match=r"^argument --engine: invalid choice: 'tinker' \(choose from 'hf', 'vllm'\)"
    ):
        parse_config(Toy, ["--engine", "tinker"], prog="toy")
    assert capsys.readouterr().err == ""  # no usage: 53 lines for grpo, above the one that matters


def test_post_init_rule_becomes_user_error():
    with pytest.raises(UserError, match="group_size=1 must be >= 2"):
        parse_config(Toy, ["--group_size", "1"], prog="toy")


def test_missing_and_non_mapping_config_files(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        parse_config(Toy, ["--config", str(tmp_path / "nope.yaml")], prog="toy")
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="must hold a mapping"):
        parse_config(Toy, ["--config", str(listing)], prog="toy")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b"group_size: 8\nengine: vllm\ngroup_size: 16\n",
            ":3: not valid YAML: group_size is given twice (first on line 1)",
        ),
        (b"", ":1: holds no settings (empty, or only comments)"),
        (b"# group_size: 8\n", ":1: holds no settings (empty, or only comments)"),
        (b"engine: vllm\nmessages: [caf\xe9]\n", ":2: not valid UTF-8; save it as UTF-8"),
    ],
    ids=["a key twice", "empty", "only comments", "not UTF-8"],
)
def test_a_config_file_that_says_a_key_twice_or_nothing_or_is_not_utf8_names_its_line(
    tmp_path, content, message
):
    """PyYAML keeps the last of two equal keys, and an empty file is no mapping: both were taken as
    settings, silently; a file not in UTF-8 was a traceback."""
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(UserError) as err:
        parse_config(Toy, ["--config", str(path)], prog="toy")
    assert str(err.value).startswith(f"config file {path}{message}")
    assert peek(["--config", str(path)], "engine") is None  # grpo's look at its game leaves it to the parse
    (tmp_path / "folder.yaml").mkdir()
    with pytest.raises(UserError, match=r"folder\.yaml is a folder, not a YAML file"):
        parse_config(Toy, ["--config", str(tmp_path / "folder.yaml")], prog="toy")


def test_save_config_round_trips(tmp_path):
    cfg = Toy(learning_rate=0.25, messages=["🍕 ok"])
    path = save_config(cfg, tmp_path / "run")
    assert yaml.safe_load(path.read_text())["learning_rate"] == 0.25
    assert parse_config(Toy, ["--config", str(path)], prog="toy") == cfg


@dataclass
class Shared:
    similarity_model: str = field(
        default="minilm", metadata={"help": "sentence embedder", "aliases": ("embedder",)}
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature", "min": 0.0})


@dataclass
class Stage(Shared):
    temperature: float = override(Shared, "temperature", 0.0)


def test_an_override_changes_the_default_and_keeps_the_help_and_bounds(capsys):
    assert parse_config(Stage, [], prog="stage").temperature == 0.0
    assert parse_config(Shared, [], prog="shared").temperature == 1.0
    with pytest.raises(UserError, match=r"temperature=-1\.0 must be >= 0\.0"):
        parse_config(Stage, ["--temperature", "-1"], prog="stage")
    with pytest.raises(SystemExit):
        parse_config(Stage, ["--help"], prog="stage")
    assert "sampling temperature (default: 0.0)" in capsys.readouterr().out


def test_a_renamed_field_still_takes_its_old_name_on_the_command_line_and_in_yaml(tmp_path):
    assert parse_config(Stage, ["--embedder", "e5"], prog="stage").similarity_model == "e5"
    path = tmp_path / "stage.yaml"
    path.write_text("embedder: e5\n")
    assert parse_config(Stage, ["--config", str(path)], prog="stage").similarity_model == "e5"
    path.write_text("embedder: e5\nsimilarity_model: e6\n")
    with pytest.raises(UserError, match="embedder and similarity_model name one field"):
        parse_config(Stage, ["--config", str(path)], prog="stage")


def test_trls_spellings_are_taken_as_hf_argument_parser_takes_them(tmp_path):
    """Dashes for underscores, `--no_FIELD`, and TRL's field names where ours differ: a TRL user's
    command line parses as they wrote it."""
    cfg = parse_config(Toy, ["--learning-rate", "3e-5", "--group-size", "8"], prog="toy")
    assert (cfg.learning_rate, cfg.group_size) == (3e-5, 8)
    path = tmp_path / "toy.yaml"
    path.write_text("resume: true\n")
    assert parse_config(Toy, ["--config", str(path), "--no_resume"], prog="toy").resume is False
    assert parse_config(Toy, ["--config", str(path), "--no-resume"], prog="toy").resume is False

    from emoji_rl.rl.train_config import config_for
    from emoji_rl.sft.trl_config import Config as SftConfig

    sft = parse_config(SftConfig, ["--model_name_or_path", "my/model", "--no_gradient_checkpointing"], "sft")
    assert (sft.model, sft.gradient_checkpointing) == ("my/model", False)
    grpo = ["--model-name-or-path", "my/model", "--per-device-train-batch-size", "2", "--no_dynamic_sampling"]
    cfg = parse_config(config_for(grpo), grpo, prog="grpo")
    assert (cfg.model, cfg.per_device_train_batch_size, cfg.dynamic_sampling) == ("my/model", 2, False)
