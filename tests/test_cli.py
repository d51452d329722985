import logging
import subprocess
import sys

import pytest
import yaml

from emoji_rl import cli


def test_help_lists_every_stage(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for stage in cli.STAGES:
        assert stage in out


def test_unknown_stage_is_an_error(capsys):
    assert cli.main(["trian"]) == 2
    assert "unknown stage 'trian'" in capsys.readouterr().err


def test_every_stage_has_config_and_main_and_help(capsys):
    import importlib

    for stage, (module_name, _) in cli.STAGES.items():
        module = importlib.import_module(module_name)
        assert callable(module.main), stage
        with pytest.raises(SystemExit) as exited:
            cli.main([stage, "--help"])
        assert exited.value.code == 0, stage
        assert f"emoji-rl {stage}" in capsys.readouterr().out


def test_a_stage_help_runs_as_a_module_in_a_fresh_process():
    result = subprocess.run(
        [sys.executable, "-m", "emoji_rl.cli", "grpo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "emoji-rl grpo" in result.stdout and "--learning_rate" in result.stdout


def test_user_error_is_printed_without_traceback(capsys):
    assert cli.main(["chat", "--unconstrained", "true", "--static_mask", "true"]) == 2
    err = capsys.readouterr().err
    assert "exclude each other" in err and "Traceback" not in err


def test_every_stage_config_file_parses():
    import importlib
    from pathlib import Path

    from emoji_rl.config import parse_config

    root = Path(__file__).resolve().parents[1] / "configs"
    files = sorted([*root.glob("cpu/*.yaml"), *root.glob("gpu/*.yaml")])
    assert files
    for path in files:
        # A file of `stages` is a pipeline's (experiment.yaml); grpo.wordle.yaml configures grpo.
        is_pipeline = "stages" in yaml.safe_load(path.read_text())
        stage = "pipeline" if is_pipeline else path.name.split(".")[0].replace("_", "-")
        assert stage in cli.STAGES, f"{path} names no stage"
        module = importlib.import_module(cli.STAGES[stage][0])
        parse_config(module.Config, ["--config", str(path)], prog=f"emoji-rl {stage}")


def test_info_lines_come_from_the_main_process_only():
    def line(environ: dict[str, str], level: int) -> str | None:
        options = cli.logging_options(environ)
        if level < options["level"]:
            return None
        record = logging.LogRecord("emoji_rl.sft", level, __file__, 1, "step %d", (3,), None)
        return logging.Formatter(options["format"], options["datefmt"]).format(record)

    assert line({}, logging.INFO).endswith(" emoji_rl.sft: step 3")
    assert line({"RANK": "0", "WORLD_SIZE": "2"}, logging.INFO).endswith(" emoji_rl.sft: step 3")
    assert line({"RANK": "1", "WORLD_SIZE": "2"}, logging.INFO) is None
    assert line({"RANK": "1", "WORLD_SIZE": "2"}, logging.WARNING).endswith(" [rank 1] emoji_rl.sft: step 3")
