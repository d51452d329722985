"""Every shipped config, and every stage command of the shipped pipelines, parses with its stage's Config.

A safety net for changes to the config dataclasses (fields regrouped, renamed, moved between modules):
each YAML file under configs/ is read by the Config of the stage it belongs to, through the project's own
parser, and each `run:` line of a pipeline file (configs/*/experiment.yaml, wordle.yaml, fault.yaml) is
split and placeholder-substituted as `emoji-rl pipeline` does it, then parsed by its stage's Config.

Only Configs are built: no model loads, nothing is written, no server is asked (`wait_for_judge` is not
called). The Configs are reached through `cli.STAGES` only, so that modules can move. Commands that run
launch scripts (`bash launch/...`, `env VAR=... bash launch/...`) are not parsed here: what they run
depends on the script and the GPU layout (tests/test_pipeline.py and tests/test_wordle_pipeline.py parse
those through the scripts' --dry-run).
"""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import pytest
import yaml

from emoji_rl import cli
from emoji_rl.cli import STAGES
from emoji_rl.config import parse_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"

# A config file's stage is its name up to the first dot, `_` read as `-` (grpo.seed.yaml -> grpo,
# eval_retrieval.yaml -> eval-retrieval). Names that are no stage's are mapped here.
STAGE_OF_NAME = {
    "experiment": "pipeline",
    "wordle": "pipeline",
    "fault": "pipeline",
}
# Folders under configs/ of files that are no emoji-rl stage's config.
NOT_STAGE_FOLDERS = {
    "accelerate": "`accelerate launch --config_file` files (launch/*.sh, tests/launching.py)"
}
# How a pipeline command that is no emoji-rl stage may start: a launch script, maybe under `env`.
LAUNCHERS = ("bash launch/", "make ")
# Stage commands the shipped pipelines hold today (cpu: experiment 10, fault 7, wordle 4; gpu:
# experiment 3, wordle 2): fewer means that commands went missing from this test, not from the files.
MIN_STAGE_COMMANDS = 26


def yaml_files() -> list[Path]:
    return sorted(p for p in CONFIGS.rglob("*") if p.suffix in {".yaml", ".yml"} and p.is_file())


def rel(path: Path) -> str:
    return path.relative_to(CONFIGS).as_posix()


def stage_of(path: Path) -> str | None:
    name = path.name.split(".", 1)[0]
    stage = STAGE_OF_NAME.get(name, name.replace("_", "-"))
    return stage if stage in STAGES else None


STAGE_CONFIGS = [p for p in yaml_files() if p.relative_to(CONFIGS).parts[0] not in NOT_STAGE_FOLDERS]
OTHER_CONFIGS = [p for p in yaml_files() if p not in STAGE_CONFIGS]
PIPELINES = [p for p in STAGE_CONFIGS if stage_of(p) == "pipeline"]


def pipeline_entries(path: Path) -> list[tuple[int, int, str, list[str]]]:
    """(index, line, stage name, words of `run`) per entry of a pipeline file's `stages`, read here
    only to name the test cases; the test itself takes the commands from the pipeline's own parser."""
    node = yaml.compose(path.read_text())
    stages = yaml.safe_load(path.read_text()).get("stages") or []
    items = next((v.value for k, v in node.value if k.value == "stages"), [])
    entries = []
    for i, (entry, item) in enumerate(zip(stages, items, strict=True)):
        run = entry.get("run") if isinstance(entry, dict) else None
        try:
            words = shlex.split(run) if isinstance(run, str) else []
        except ValueError:
            words = []
        name = entry.get("name") if isinstance(entry, dict) else None
        entries.append((i, item.start_mark.line + 1, str(name), words))
    return entries


COMMANDS = [(path, *entry) for path in PIPELINES for entry in pipeline_entries(path)]
STAGE_COMMANDS = [c for c in COMMANDS if c[4][:1] and c[4][0] in STAGES]
LAUNCH_COMMANDS = [c for c in COMMANDS if c not in STAGE_COMMANDS]


def command_id(command: tuple) -> str:
    path, i, _line, name, _words = command
    return f"{rel(path)}:stages[{i}]:{name}"


def config_class(stage: str, argv: list[str]) -> type:
    return cli.config_class(importlib.import_module(STAGES[stage][0]), argv)


def parse(stage: str, argv: list[str], where: str) -> object:
    """`emoji-rl STAGE ARGV`'s Config, as cli.main parses it; a failure names `where` and the command."""
    cls = config_class(stage, argv)
    try:
        cfg = parse_config(cls, argv, prog=f"emoji-rl {stage}")
    except Exception as err:  # UserError (a flag, a YAML key or value) or a check of __post_init__
        error = f"{type(err).__name__}: {err}"
    else:
        assert isinstance(cfg, cls), (where, type(cfg))
        return cfg
    pytest.fail(f"{where}: emoji-rl {stage} {shlex.join(argv)}\n{error}", pytrace=False)


@pytest.fixture(autouse=True)
def _at_repo_root(monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name their config files from the repository root


@pytest.mark.parametrize("path", STAGE_CONFIGS, ids=rel)
def test_each_config_file_parses_with_its_stages_config(path):
    stage = stage_of(path)
    if stage is None:
        pytest.fail(
            f"configs/{rel(path)}: no emoji-rl stage is named {path.name.split('.', 1)[0].replace('_', '-')!r}; "
            f"map the file's name to its stage in STAGE_OF_NAME in {Path(__file__).name} (a pipeline file "
            f"to 'pipeline'), or its folder in NOT_STAGE_FOLDERS if it is no stage's config",
            pytrace=False,
        )
    parse(stage, ["--config", str(path.relative_to(ROOT))], f"configs/{rel(path)}")


@pytest.mark.parametrize("command", STAGE_COMMANDS, ids=command_id)
def test_each_pipeline_stage_command_parses_with_its_stages_config(command):
    path, i, line, name, words = command
    pipeline = importlib.import_module(STAGES["pipeline"][0])
    cfg = parse("pipeline", ["--config", str(path.relative_to(ROOT))], f"configs/{rel(path)}")
    stages = pipeline.parse_stages(cfg.stages, cfg.run_dir)  # shlex, {run_dir} replaced, as the runner does
    where = f"configs/{rel(path)} line {line} (stages[{i}], {name})"
    assert stages[i].name == name, where
    argv = stages[i].command
    assert argv[0] == words[0], where
    parse(argv[0], argv[1:], where)


def test_the_commands_left_unparsed_are_launch_scripts_and_the_parsed_are_enough():
    assert PIPELINES, "no pipeline file found under configs/"
    for command in LAUNCH_COMMANDS:
        words = command[4]
        while words and (words[0] == "env" or "=" in words[0]):
            words = words[1:]  # `env VAR=value ... COMMAND`: the command
        assert shlex.join(words).startswith(LAUNCHERS), (
            f"{command_id(command)}: {shlex.join(command[4])!r} is neither an emoji-rl stage nor a launch "
            f"script; parse it here, or add its launcher to LAUNCHERS in {Path(__file__).name}"
        )
    assert len(STAGE_COMMANDS) >= MIN_STAGE_COMMANDS, [command_id(c) for c in STAGE_COMMANDS]


@pytest.mark.parametrize("path", OTHER_CONFIGS, ids=rel)
def test_the_files_beside_the_stage_configs_are_what_their_folder_holds(path):
    data = yaml.safe_load(path.read_text())
    folder = path.relative_to(CONFIGS).parts[0]
    assert folder == "accelerate", f"configs/{rel(path)}: say in this test what {folder}/ holds"
    assert isinstance(data, dict) and {"compute_environment", "distributed_type"} <= set(data), (
        f"configs/{rel(path)} is not an accelerate config: a stage's config goes in configs/cpu or configs/gpu"
    )
