"""A run's config.yaml written before the game contract changed (#60, at 1896e1c: one per built-in
game, tests/fixtures/grpo_config_1896e1c/) still loads as `grpo --config` (what a resumed run is
given), and the config it loads writes back the same keys and values: a resume across the change
goes on with the settings it started with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from emoji_rl.config import parse_config, save_config, to_dict
from emoji_rl.rl.train_config import config_for

SAVED = Path(__file__).parent.parent / "fixtures" / "grpo_config_1896e1c"


@pytest.mark.parametrize("game", ["retrieval", "wordle", "reader"])
def test_a_config_yaml_saved_before_the_change_loads_and_saves_the_same(game, tmp_path):
    argv = ["--config", str(SAVED / f"{game}.yaml"), "--resume", "true"]
    cfg = parse_config(config_for(argv), argv, prog="emoji-rl grpo")
    before = yaml.safe_load((SAVED / f"{game}.yaml").read_text())
    assert cfg.game == game and {**to_dict(cfg), "resume": False} == before
    again = yaml.safe_load(save_config(cfg, tmp_path).read_text())
    assert {**again, "resume": False} == before
