"""The games a stage can play, found by name: `emoji-rl grpo --game NAME`, `emoji-rl eval --game NAME`.

A game is a `GameSpec` (play/spec.py). The trainer, the decoders and the evaluation name no game:
they hold a `GameSpec`.

The registry reads the entry-point group `emoji_rl.games` (each entry point names a `GameSpec`), so an
installed package adds a game without editing this one; the built-in games (emoji_rl/games/) are
listed there by this project's own pyproject.toml. `register` adds one defined in this process (a
test, a notebook).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

from emoji_rl.errors import UserError
from emoji_rl.play.spec import GameSpec

ENTRY_POINTS = "emoji_rl.games"
DEFAULT_GAME = "retrieval"
"""What a stage plays when no game is named: the game this project is about."""


_registered: dict[str, GameSpec] = {}


def register(spec: GameSpec) -> None:
    """Make `spec` playable by name in this process, beside the installed games."""
    _registered[spec.name] = spec


def _installed() -> dict[str, list[EntryPoint]]:
    found: dict[str, list[EntryPoint]] = {}
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
