import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emoji_rl import cli

ROOT = Path(__file__).resolve().parents[1]


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
        argv = cli.stage_argv(stage, ["--config", str(path)])
        parse_config(cli.config_class(module, argv), argv, prog=f"emoji-rl {stage}")


@pytest.mark.parametrize("game", ["retrieval", "wordle", "reader"])
def test_an_eval_alias_is_eval_with_its_game_and_takes_no_other(game, capsys):
    from emoji_rl.config import parse_config, to_dict
    from emoji_rl.play import evaluate

    flags = ["--seed", "3", "--max_examples", "2"]
    alias = cli.stage_argv(f"eval-{game}", flags)
    plain = ["--game", game, *flags]
    assert cli.STAGES[f"eval-{game}"][0] == cli.STAGES["eval"][0] == evaluate.__name__
    parsed = [parse_config(evaluate.config_for(argv), argv, prog="emoji-rl eval") for argv in (alias, plain)]
    assert parsed[0].game == game and to_dict(parsed[0]) == to_dict(parsed[1])
    assert cli.main([f"eval-{game}", "--game", "other", "--output_dir", "x"]) == 2
    assert f"eval-{game} is `eval --game {game}`: leave out --game" in capsys.readouterr().err


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


@pytest.mark.parametrize(
    ("stage", "key"), [("eval-retrieval", "output_dir"), ("teacher", "output_dir"), ("sft", "output_dir")]
)
def test_an_output_path_blocked_by_a_file_fails_before_any_work(tmp_path, capsys, stage, key):
    blocker = tmp_path / "results"
    blocker.write_text("not a directory")
    for value in (blocker, blocker / "run"):  # the path itself, or a parent of it, is a file
        assert cli.main([stage, f"--{key}", str(value)]) == 2
        err = capsys.readouterr().err
        assert f"{key}={value}: {blocker} is a file, where a directory is needed" in err, err
        assert "Traceback" not in err
    assert blocker.read_text() == "not a directory"


def test_an_output_path_that_cannot_be_written_names_the_directory(tmp_path, capsys, monkeypatch):
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != tmp_path and real_access(path, mode))
    assert cli.main(["eval-retrieval", "--output_dir", str(tmp_path / "a" / "b")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path} cannot be written to (read-only?); choose another --output_dir" in err
    assert not (tmp_path / "a").exists()  # nothing made


def test_a_full_disk_is_one_line_naming_the_file(capsys, monkeypatch):
    import errno

    from emoji_rl.data import teacher

    def full(cfg):
        raise OSError(errno.ENOSPC, "No space left on device", "data/teacher_answers.jsonl")

    monkeypatch.setattr(teacher, "main", full)
    assert cli.main(["teacher", "--teacher", "offline", "--prompts", "data/samples/rl_eval.jsonl"]) == 1
    err = capsys.readouterr().err
    assert "emoji-rl teacher: error: No space left on device (data/teacher_answers.jsonl)" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("stage", ["eval-retrieval", "judge-check", "play-game"])
def test_an_unreachable_judge_server_is_named_before_any_model_loads(capsys, monkeypatch, stage):
    from emoji_rl.lm import models

    def must_not_load(*args, **kwargs):
        raise AssertionError("a model loaded before the judge server was checked")

    for loader in ("load_causal_lm", "load_tokenizer", "load_embedder"):
        monkeypatch.setattr(models, loader, must_not_load)
    args = [stage, "--judge", "openai", "--judge_url", "http://127.0.0.1:9", "--server_wait_s", "0.5"]
    args += ["--data", "data/samples/rl_eval.jsonl"] if stage == "eval-retrieval" else []
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "http://127.0.0.1:9" in err and "judge server" in err and "Traceback" not in err


def test_the_console_shows_no_line_per_http_request(capfd):
    """A stage's console is the progress bar and what we log: httpx's line per request stays out."""
    import httpx

    handler = logging.StreamHandler()  # what cli.main's basicConfig installs: the root logger, at info
    root = logging.getLogger()
    level = root.level
    for name in cli.HTTP_CLIENT_LOGGERS:  # as a fresh process has them (cli.main run before quiets them)
        logging.getLogger(name).setLevel(logging.NOTSET)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"ok": True}))
        with httpx.Client(transport=transport) as client:
            client.get("http://policy.test/health")
            assert "HTTP Request: GET http://policy.test/health" in capfd.readouterr().err  # httpx's own line
            cli.quiet_http_clients()
            client.get("http://policy.test/health")
        assert "HTTP Request" not in capfd.readouterr().err
        logging.getLogger("httpx").warning("a retry")  # warnings still reach the console
        assert "a retry" in capfd.readouterr().err
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        for name in cli.HTTP_CLIENT_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_the_data_stages_take_output_dir_and_their_older_spellings(tmp_path):
    from emoji_rl.config import parse_config
    from emoji_rl.data import prompt_sources, rl_prompts, teacher

    out = str(tmp_path / "d")
    for cls in (teacher.Config, rl_prompts.Config):
        assert parse_config(cls, ["--output_dir", out], "x").output_dir == out
        assert parse_config(cls, ["--out_dir", out], "x").output_dir == out
    prompts = parse_config(prompt_sources.Config, ["--output_dir", out], "x")
    assert prompts.path == tmp_path / "d" / "prompts.jsonl"
    older = parse_config(prompt_sources.Config, ["--out", f"{out}/mine.jsonl"], "x")
    assert (older.path, older.output_dir) == (tmp_path / "d" / "mine.jsonl", out)


@pytest.mark.parametrize(
    ("stage", "args", "missing"),
    [
        ("sft", ["--config", "configs/gpu/sft.yaml"], "train_data=data/sft_train.jsonl"),
        (
            "grpo",
            ["--config", "configs/gpu/grpo.yaml", "--init_adapter", "none"],
            "train_data=data/rl_train.jsonl",
        ),
        (
            "grpo",
            ["--config", "configs/gpu/grpo.yaml", "--train_data", "data/samples/rl_eval.jsonl"],
            "init_adapter=runs/sft-gpu/adapter",
        ),
        ("eval-sft", ["--config", "configs/gpu/eval_sft.yaml"], "adapter=runs/sft-gpu/adapter"),
        (
            "eval-retrieval",
            ["--config", "configs/gpu/eval_retrieval.yaml", "--data", "data/samples/rl_eval.jsonl"],
            "systems=sft=runs/sft-gpu/adapter",
        ),
    ],
)
def test_a_missing_input_stops_the_stage_at_once_naming_its_key(
    tmp_path, capsys, monkeypatch, stage, args, missing
):
    # docs/gpu/README.md's steps on a fresh box: a stage run before the one that writes its input stops
    # in its first second, not after the model has loaded.
    import importlib
    import time

    from emoji_rl.lm import models

    def must_not_load(*args, **kwargs):
        raise AssertionError("a model loaded before the stage's inputs were checked")

    for loader in ("load_causal_lm", "load_base_model", "load_tokenizer", "load_embedder"):
        monkeypatch.setattr(models, loader, must_not_load)
    monkeypatch.chdir(ROOT)
    importlib.import_module(cli.STAGES[stage][0])  # the stage's imports are not what is timed
    start = time.monotonic()
    # The lexicon judge: a missing input is named before a judge server is waited for.
    judge = ["--judge", "lexicon", "--judge_view", "gloss"] if stage != "sft" else []
    assert cli.main([stage, *args, *judge, "--output_dir", str(tmp_path / "run")]) == 2
    assert time.monotonic() - start < 1.0
    err = capsys.readouterr().err
    assert f"no such file or directory: {missing} (" in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
