"""The game contract (play/spec.py): a stage's flat Config of its fields and the game's, a game field
the stage also has refused when the Config is built, naming both, and the game's own typed config
taken back out for its setup."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from emoji_rl import cli
from emoji_rl.config import parse_config
from emoji_rl.errors import UserError
from emoji_rl.play import registry
from emoji_rl.play.evaluation import EvalConfig
from emoji_rl.play.spec import GameConfig, GameSpec, game_config, stage_config
from emoji_rl.rl.train_config import TrainConfig


@dataclass
class Rules(GameConfig):
    """A game's own fields."""

    hint: str = field(default="none", metadata={"help": "what the game says first"})


@dataclass
class Shadowing(Rules):
    seed: int = field(default=7, metadata={"help": "the game's own seed"})
    data: str = field(default="mine.jsonl", metadata={"help": "the game's records"})


def spec(config: type[GameConfig]) -> GameSpec:
    return GameSpec("toy", "a toy", config, lambda cfg, context: None)


def test_a_stage_config_is_flat_and_the_game_gets_its_own_part_typed():
    cls = stage_config(TrainConfig, spec(Rules))
    cfg = parse_config(cls, ["--hint", "cat", "--max_turns", "3", "--seed", "4"], prog="grpo")
    assert (cfg.game, cfg.hint, cfg.max_turns, cfg.seed) == ("toy", "cat", 3, 4)
    own = game_config(spec(Rules), cfg)
    assert type(own) is Rules and (own.hint, own.max_turns) == ("cat", 3)


def test_a_game_field_the_stage_has_too_is_refused_naming_both():
    with pytest.raises(
        UserError,
        match=r"game 'toy' declares a field the stage's TrainConfig has too: "
        r"seed is Shadowing's and TrainConfig's\. A game's fields are its own",
    ):
        stage_config(TrainConfig, spec(Shadowing))
    with pytest.raises(UserError, match=r"data is Shadowing's and EvalConfig's; seed is Shadowing's and "):
        stage_config(EvalConfig, spec(Shadowing))


def test_grpo_refuses_the_clash_as_its_config_is_built(monkeypatch, capsys):
    monkeypatch.setattr(registry, "_registered", {})
    registry.register(GameSpec("shadowing", "a clash", Shadowing, lambda cfg, context: None))
    assert cli.main(["grpo", "--game", "shadowing"]) == 2
    assert "seed is Shadowing's and TrainConfig's" in capsys.readouterr().err


def test_every_installed_game_builds_its_grpo_and_eval_configs():
    from emoji_rl.play import evaluate
    from emoji_rl.rl.train_config import config_class

    for name in ("retrieval", "wordle", "reader"):
        assert config_class(name)().game == name
        assert evaluate.config_class(name)().game == name
