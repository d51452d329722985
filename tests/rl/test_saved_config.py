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
    loaded = to_dict(cfg)
    assert {key: loaded[key] for key in ADDED} == ADDED  # fields added since, at their defaults
    assert cfg.game == game and {**without_added(loaded), "resume": False} == before
    again = yaml.safe_load(save_config(cfg, tmp_path).read_text())
    assert {**without_added(again), "resume": False} == before


ADDED = {"baseline": "group", "baseline_decay": 0.95}
"""Trainer fields added after the saved configs (#61: seats), with the defaults a resume takes."""


def without_added(values: dict) -> dict:
    return {key: value for key, value in values.items() if key not in ADDED}
