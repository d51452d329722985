"""One game as every stage finds it: a `GameSpec` is its name, its own typed config (`GameConfig`),
the one `setup` that builds what it plays from that config and what it may know of the run
(`GameContext`), for training and evaluation alike, and how its evaluation reports (`Evaluation`,
play/evaluation.py), or None.

A stage's command line and YAML stay flat (`--tau 0.8`, as TRL's): `stage_config` makes one
dataclass of the stage's fields and the game's, and refuses a game field the stage also has, naming
both; `game_config` takes the game's own typed object back out of it for `setup`. How to write a game:
docs/ARCHITECTURE.md, "Write a game".
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from emoji_rl.config import Checked
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.lm.models import Runtime
    from emoji_rl.play.evaluation import Evaluation
    from emoji_rl.play.types import GameSetup, Record


@dataclass
class GameConfig(Checked):
    """The fields every game has. A game's own config subclasses it; a stage that plays the game sets
    its fields as any other (`--max_turns 3`, YAML), and its `setup` receives it typed."""

    max_turns: int = field(default=1, metadata={"help": "policy turns before the game ends", "min": 1})

    def read_records(self, path: str, stage: RunSettings) -> list[Record]:
        """The game's records in the JSONL file `path` (grpo's train_data and eval_data, eval's data),
        checked as the game needs them; the stages read them before any model loads or anything is
        written (`read_game_records`). This one takes any JSON objects."""
        return read_jsonl(path, hint="the game's records, one JSON object per line")

    def off_policy_blocker(self) -> str | None:
        """Why this game cannot be sampled by an adapter some versions behind the trainer's weights
        (`max_off_policy_steps` > 0), or None. A game that learns from each step's episodes (a
        curriculum) would build the next step's games before it saw the last step's."""
        return None

    def wait_for_servers(self, wait_s: float) -> None:
        """Wait up to `wait_s` seconds for the servers the game's partners answer on (a judge's), before
        the stage loads any model: a wrong URL is named in seconds, not after minutes of loading."""


@dataclass(frozen=True)
class PolicyServer:
    """The vLLM server that samples the policy (grpo's `--engine vllm`), which a partner may answer
    on too (the reader's frozen sender, by default the server's base model)."""

    url: str
    served_name: str


@dataclass(frozen=True)
class GameContext:
    """What a game may know of the run that plays it, beside its own config: nothing else of the
    trainer's or the evaluation's settings reaches a game."""

    tokenizer: PreTrainedTokenizerBase
    """The policy's tokenizer: a game's observations are its token ids."""
    runtime: Runtime
    """Where models run (device, dtype): a partner the game loads in process runs there."""
    seed: int
    """The run's seed, for the game's own draws (a sample of messages, distractors)."""
    records: list[Record]
    """The records it plays, as its config's `read_records` read them: grpo's `train_data`, an
    evaluation's held-out `data`."""
    model: str
    """The policy's model spec, which a partner may fall back on (the reader's sender)."""
    min_emoji: int
    max_emoji: int
    """An emoji message's length as the policy samples it under the grammar (`min_emoji`..`max_emoji`)."""
    server_wait_s: float
    """How long a partner's server may take to answer at start (the run's `server_wait_s`)."""
    policy_server: PolicyServer | None = None
    """The server the policy samples on, if it samples on one (None: in process)."""

    @classmethod
    def of(
        cls,
        stage: RunSettings,
        tokenizer: PreTrainedTokenizerBase,
        runtime: Runtime,
        records: list[Record],
        policy_server: PolicyServer | None = None,
    ) -> GameContext:
        """The context a stage gives the game: its settings (`RunSettings`), and the records it plays."""
        return cls(
            tokenizer,
            runtime,
            seed=stage.seed,
            records=records,
            model=stage.model,
            min_emoji=stage.min_emoji,
            max_emoji=stage.max_emoji,
            server_wait_s=stage.server_wait_s,
            policy_server=policy_server,
        )


class RunSettings(Protocol):
    """The settings of a stage that plays a game, that a game may know (grpo's and eval's Configs)."""

    seed: int
    model: str
    min_emoji: int
    max_emoji: int
    server_wait_s: float


def read_game_records(config: GameConfig, key: str, path: str, stage: RunSettings) -> list[Record]:
    """The records in `path`, the stage's field `key`, read the game's way; an error names the field.
    Every stage calls it before any model loads: a missing or wrong file costs no model load."""
    try:
        return config.read_records(path, stage)
    except UserError as err:
        raise UserError(f"{key}: {err}") from None


C = TypeVar("C", bound=GameConfig)
GAME_HELP = {
    "help": "the game played: a name the game registry knows (emoji_rl/games/, or an installed package's)"
}


@dataclass(frozen=True)
class GameSpec(Generic[C]):
    """One game, as the trainer and the evaluation find it (`registry.load`)."""

    name: str
    description: str
    """One line, for `--help` and logs."""
    config: type[C]
    setup: Callable[[C, GameContext], GameSetup]
    """setup(config, context): what the stages play, built once (the records, the games' builder, the
    services its games share), for training and evaluation alike."""
    evaluation: Evaluation | None = None
    """How `emoji-rl eval --game NAME` reports the game (None: it has no evaluation)."""


def declared_by(cls: type, name: str) -> str:
    """The class of `cls`'s bases that declares field `name` first (the one whose help it shows)."""
    for base in reversed(cls.__mro__):
        if dataclasses.is_dataclass(base) and name in inspect.get_annotations(base):
            return base.__name__
    return cls.__name__


def stage_config(stage: type, spec: GameSpec, *own: type, doc: str = "") -> type:
    """A stage's Config for `spec`'s game: `own` (fields that say how the stage plays this game, which
    may change a default of the stage's or of the game's), the stage's and the game's fields, as one
    flat dataclass, so that YAML and the command line set any of them alike; the stage's `game` field
    defaults to this game. A game field the stage also has is refused, naming both: the game would
    read the stage's value, or the stage the game's."""
    stage_fields = {f.name: f for f in dataclasses.fields(stage)}
    clashes = sorted(stage_fields.keys() & {f.name for f in dataclasses.fields(spec.config)})
    if clashes:
        both = "; ".join(
            f"{name} is {declared_by(spec.config, name)}'s and {declared_by(stage, name)}'s"
            for name in clashes
        )
        raise UserError(
            f"game {spec.name!r} declares a field the stage's {stage.__name__} has too: {both}. A game's "
            "fields are its own: rename it in the game's config (what it may know of the run comes in "
            "its GameContext)"
        )
    chosen = stage_fields.get("game")
    game = ("game", str, field(default=spec.name, metadata=chosen.metadata if chosen else GAME_HELP))
    return dataclasses.make_dataclass(
        "Config", [game], bases=(*own, stage, spec.config), namespace={"__doc__": doc or stage.__doc__}
    )


def game_config(spec: GameSpec[C], cfg: object) -> C:
    """The game's own typed config, taken from a stage's flat one (`stage_config`)."""
    values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(spec.config) if f.init}
    return spec.config(**values)
