"""The games a stage can play, found by name: `emoji-rl grpo --game NAME`.

A game is a `GameSpec`: its name, its own config fields (a `GameConfig` dataclass, which `grpo --game
NAME` adds to the trainer's fields), and `setup`, which builds what the trainer plays from the whole
config (`GameSetup`: a builder of games, the records, the constraint the policy samples under), and
optionally `evaluation`, its hooks into the evaluation path (game/evaluation.py). The trainer, the
decoders and the evaluation name no game: they hold a `GameSpec`.

The registry reads the entry-point group `emoji_rl.games` (each entry point names a `GameSpec`), so an
installed package adds a game without editing this one; the built-in games (emoji_rl/games/) are
listed there by this project's own pyproject.toml. `register` adds one defined in this process (a
test, a notebook).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from emoji_rl.config import Checked
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl

if TYPE_CHECKING:
    from emoji_rl.game.evaluation import Evaluation
    from emoji_rl.game.types import GameSetup, Record
    from emoji_rl.lm.models import Runtime

ENTRY_POINTS = "emoji_rl.games"
DEFAULT_GAME = "retrieval"
"""What a stage plays when no game is named: the game this project is about."""


@dataclass
class GameConfig(Checked):
    """The fields every game has. A game's own config subclasses it; `grpo --game NAME` mixes that
    dataclass into the trainer's, so a game's fields are set as any other (`--max_turns 3`, YAML)."""

    max_turns: int = field(default=1, metadata={"help": "policy turns before the game ends", "min": 1})

    def read_records(self, path: str) -> list[Record]:
        """The game's records in the JSONL file `path` (its train_data, eval_data), checked as the game
        needs them. A method of the config, so that a stage reads them before any model loads; this
        one takes any JSON objects."""
        return read_jsonl(path, hint="the game's records, one JSON object per line")

    def off_policy_blocker(self) -> str | None:
        """Why this game cannot be sampled by an adapter some versions behind the trainer's weights
        (`max_off_policy_steps` > 0), or None. A game that learns from each step's episodes (a
        curriculum) would build the next step's games before it saw the last step's."""
        return None


@dataclass(frozen=True)
class GameContext:
    """What a game's setup is given beside the config: the policy's tokenizer, where models run, and
    the width of the policy's LM head (a grammar's masks are that wide)."""

    tokenizer: Any
    runtime: Runtime
    vocab_size: int


@dataclass(frozen=True)
class GameSpec:
    """One game, as the trainer and the evaluation find it."""

    name: str
    description: str
    """One line, for `--help` and logs."""
    config: type[GameConfig]
    setup: Callable[[Any, GameContext], GameSetup]
    """setup(cfg, context): the game's `GameSetup` from the whole config (the trainer's fields and
    the game's)."""
    evaluation: Evaluation | None = None
    """How `evaluate` plays and reports the game on held-out records (None: it has no evaluation)."""


_registered: dict[str, GameSpec] = {}


def register(spec: GameSpec) -> None:
    """Make `spec` playable by name in this process, beside the installed games."""
    _registered[spec.name] = spec


def _installed() -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for point in entry_points(group=ENTRY_POINTS):
        found.setdefault(point.name, []).append(point)
    return found


def names() -> list[str]:
    """Every game this process can play, sorted."""
    return sorted(_registered.keys() | _installed().keys())


def load(name: str) -> GameSpec:
    """The game called `name`: one registered in this process, or an installed entry point's."""
    if name in _registered:
        return _registered[name]
    points = _installed().get(name, [])
    if not points:
        raise UserError(
            f"no game {name!r}; games: {', '.join(names()) or 'none'}. A package adds one as an entry point "
            f"in the group {ENTRY_POINTS!r}; this project's own games come with `pip install -e .`"
        )
    if len({point.value for point in points}) > 1:
        raise UserError(
            f"game {name!r} is defined twice, by {' and '.join(point.value for point in points)}: "
            "uninstall one of the packages"
        )
    spec = points[0].load()
    if not isinstance(spec, GameSpec) or spec.name != name:
        raise UserError(f"entry point {name} = {points[0].value} is not a GameSpec named {name!r}")
    return spec
