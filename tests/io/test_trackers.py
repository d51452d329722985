"""`report_to` as TRL reads it, on both training stages: names, lists, `none` and `all`; a tracker
that does not import is named with the extras command before any work; the tracker run a run
directory keeps."""

import json
import os
import re
import subprocess
import sys

import pytest

from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.io.trackers import (
    EXTRAS,
    STATE_FILE,
    Held,
    TrackerConfig,
    keep_mlflow_run,
    resolve,
    tracker_run,
)
from emoji_rl.rl.train_config import config_class
from emoji_rl.sft.trl_config import Config as SftConfig

STAGES = [config_class("retrieval"), SftConfig]
# What `make setup` installs (the trackers extra): accelerate's other trackers are the user's to add.
INSTALLED = ("tensorboard", "wandb", "trackio", "mlflow")
CHOICES = "tensorboard, wandb, trackio, mlflow, comet_ml, clearml, dvclive, aim, swanlab, all, none"


@pytest.mark.parametrize("stage", STAGES)
def test_report_to_takes_trls_names_alone_or_as_a_list(stage, tmp_path):
    assert parse_config(stage, [], "stage").report_to == ["tensorboard"]
    assert parse_config(stage, ["--report_to", "wandb", "trackio"], "stage").report_to == ["wandb", "trackio"]
    assert parse_config(stage, ["--report_to", "mlflow"], "stage").report_to == ["mlflow"]
    one, listed = tmp_path / "one.yaml", tmp_path / "listed.yaml"
    one.write_text("report_to: none\n")
    listed.write_text("report_to: [tensorboard, trackio]\n")
    assert parse_config(stage, ["--config", str(one)], "stage").report_to == ["none"]
    assert parse_config(stage, ["--config", str(listed)], "stage").report_to == ["tensorboard", "trackio"]


@pytest.mark.parametrize("stage", STAGES)
def test_an_unknown_tracker_names_the_key_and_the_choices(stage, tmp_path):
    with pytest.raises(UserError, match="argument --report_to: invalid choice: 'mlflw'") as err:
        parse_config(stage, ["--report_to", "wandb", "mlflw"], "stage")
    assert ", ".join(f"'{name}'" for name in CHOICES.split(", ")) in str(err.value)
    path = tmp_path / "bad.yaml"
    path.write_text("report_to: [wandb, mlflw]\n")
    with pytest.raises(UserError, match=f"report_to must be one of {CHOICES}"):
        parse_config(stage, ["--config", str(path)], "stage")


def test_none_stands_alone_and_all_is_every_installed_tracker():
    assert resolve(["none"]) == ()
    assert resolve(["all"]) == INSTALLED
    assert resolve(["wandb", "tensorboard", "wandb"]) == ("wandb", "tensorboard")
    with pytest.raises(UserError, match="none means no tracker"):
        resolve(["none", "wandb"])


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize(
    ("package", "install"),
    [
        ("wandb", EXTRAS),
        ("trackio", EXTRAS),
        ("mlflow", EXTRAS),
        ("comet_ml", "pip install comet-ml"),
        ("clearml", "pip install clearml"),
        ("dvclive", "pip install dvclive"),
        ("aim", "pip install 'aim<4'"),
        ("swanlab", "pip install swanlab"),
    ],
)
def test_a_tracker_that_does_not_import_names_its_install_command(stage, package, install, monkeypatch):
    monkeypatch.setitem(sys.modules, package, None)  # what `import` sees where the package is missing
    with pytest.raises(
        UserError, match=rf"report_to {package}: the {package} package does not import"
    ) as err:
        parse_config(stage, ["--report_to", "tensorboard", package], "stage")
    assert str(err.value).endswith(f"install it with {install}")
    assert resolve(["all"]) == tuple(name for name in INSTALLED if name != package)


@pytest.mark.parametrize("stage", STAGES)
def test_an_mlflow_store_mlflow_refuses_is_named_when_parsed(stage, tmp_path, monkeypatch):
    # A folder mlflow has not been allowed to keep runs in (its file store is in maintenance mode).
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    with pytest.raises(
        UserError, match=r"report_to mlflow: mlflow cannot keep runs at its tracking URI file:"
    ):
        parse_config(stage, ["--report_to", "mlflow"], "stage")
    # `all` leaves out an installed mlflow it could not log to, rather than stop the stage
    assert "mlflow" in INSTALLED and resolve(["all"]) == tuple(n for n in INSTALLED if n != "mlflow")
    assert parse_config(stage, ["--report_to", "all"], "stage").report_to == ["all"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # a server: not contacted yet
    assert parse_config(stage, ["--report_to", "mlflow"], "stage").report_to == ["mlflow"]
    assert resolve(["all"]) == INSTALLED
    # A folder it cannot make (under a file, which even root cannot write into): one line, as above.
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "file" / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with pytest.raises(UserError, match=r"report_to mlflow: mlflow cannot keep runs at .*Not a directory"):
        parse_config(stage, ["--report_to", "mlflow"], "stage")


WANDB_CHECKS = """
import os, wandb
from emoji_rl.errors import UserError
from emoji_rl.io.trackers import TrackerConfig, check_trackers

for name, value in [(None, None), ("WANDB_API_KEY", "k" * 40), ("WANDB_MODE", "offline")]:
    os.environ.update({name: value} if name else {})
    try:
        check_trackers(TrackerConfig(report_to=["wandb"]))
        print("taken")
    except UserError as err:
        print(err)
    os.environ.pop(name or "", None)
    wandb.teardown()  # wandb reads its settings from the environment once, until then
"""


def test_an_online_wandb_without_a_key_is_named_when_parsed(tmp_path):
    """wandb.init asks for a key at a prompt, or stops without a terminal, once the model has loaded and
    the run directory is written: wandb's own search for credentials (its environment, ~/.netrc, its
    settings), in a process of its own with a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "NETRC"))}
    env |= {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path), "WANDB_MODE": "online"}
    done = subprocess.run([sys.executable, "-c", WANDB_CHECKS], env=env, capture_output=True, text=True)
    refused, with_a_key, offline = done.stdout.splitlines()
    assert refused.startswith("report_to wandb: wandb logs online (WANDB_MODE=online) and finds no API key")
    assert refused.endswith("run `wandb login` or set WANDB_API_KEY, or set WANDB_MODE=offline to keep the run "
                            "in the run directory and `wandb sync` it later")  # fmt: skip
    assert (with_a_key, offline) == ("taken", "taken")


def test_the_tracker_run_is_kept_in_the_run_directory(tmp_path):
    run_dir = tmp_path / "grpo"
    first = tracker_run(run_dir, TrackerConfig(project="first"))
    assert first.project == "first" and first.name == f"grpo-{first.id}" and len(first.id) == 8
    # A resume continues it, whatever the project and name say now.
    assert tracker_run(run_dir, TrackerConfig(project="second", run_name="other")) == first
    assert json.loads((run_dir / STATE_FILE).read_text()) == {
        "id": first.id,
        "project": "first",
        "name": first.name,
    }
    # mlflow gives its run an id of its own when it starts it: kept beside wandb's.
    kept = keep_mlflow_run(run_dir, first, "0123abcd")
    assert tracker_run(run_dir, TrackerConfig()) == kept and kept.mlflow_run_id == "0123abcd"
    assert json.loads((run_dir / STATE_FILE).read_text())["mlflow_run_id"] == "0123abcd"
    (run_dir / STATE_FILE).write_text('{"id": "x"}')
    with pytest.raises(UserError, match=f"{STATE_FILE} is not a tracker run"):
        tracker_run(run_dir, TrackerConfig())


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("project", ["team/emoji", "run#1", "what?", "100%", "a:b"])
def test_a_project_name_wandb_refuses_is_named_when_parsed_before_anything_is_written(
    stage, project, tmp_path
):
    run = tmp_path / "run"
    argv = ["--report_to", "wandb", "--project", project, "--output_dir", str(run)]
    refused = re.escape(f"project={project!r}: wandb refuses it (") + ".*choose another --project"
    with pytest.raises(UserError, match=refused):
        parse_config(stage, argv, "stage")
    assert not run.exists()
    assert parse_config(stage, ["--project", project], "stage").project == project  # no wandb: no rule


@pytest.mark.parametrize("stage", STAGES)
def test_an_empty_report_to_or_project_and_a_report_to_of_the_wrong_type_are_named(stage, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("report_to: []\n")
    with pytest.raises(UserError, match="report_to is empty"):
        parse_config(stage, ["--config", str(empty)], "stage")
    with pytest.raises(UserError, match="project is empty"):
        parse_config(stage, ["--project", ""], "stage")
    number = tmp_path / "number.yaml"
    number.write_text("report_to: 5\n")
    with pytest.raises(
        UserError, match=r"report_to must be one of tensorboard, .*, or a list of them; got 5$"
    ):
        parse_config(stage, ["--config", str(number)], "stage")


def test_a_tracker_is_sent_what_it_lacks_counted_per_name_not_per_step():
    """A kill between step 2's training line and its evaluation: the tracker holds the first."""
    held = Held(2, {"train/loss", "train/epoch"})
    assert held.take(1, {"train/loss": 1.0}) == {}
    assert held.take(2, {"train/loss": 0.5, "train/epoch": 1.0}) == {}
    assert held.take(2, {"eval/loss": 0.7, "train/epoch": 1.0}) == {"eval/loss": 0.7}
    assert held.take(2, {"eval/loss": 0.6}) == {}  # a name once per step
    assert held.take(3, {"train/loss": 0.4}) == {"train/loss": 0.4}
    assert held.take(3, {"eval/loss": 0.5, "train/loss": 0.4}) == {"eval/loss": 0.5}
    whole = Held(2, None)  # wandb: a step is there whole, or not at all
    assert whole.take(2, {"eval/loss": 0.7}) == {} and whole.take(3, {"eval/loss": 0.5}) == {"eval/loss": 0.5}
