"""What a game gives the one evaluation path (`game/evaluate.py`): its `Evaluation`, on its `GameSpec`.

The path plays systems x held-out records through the game, in each of the game's modes, keeps one
record per game, and reports each system's row of the game's own final metrics and paired bootstrap
intervals of the differences between systems. A system is a model (`base`, or NAME=ADAPTER_DIR) or a
`Scripted` one, whose replies follow from the records alone (a teacher's answers, random answers, a
solver's moves). How a game adds its evaluation: docs/EVALUATION.md, "A game's evaluation". The path
names no game (tests/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from emoji_rl.config import Checked
from emoji_rl.decode.senders import parse_systems
from emoji_rl.game.compare import Metric, compare_pairs
from emoji_rl.io.jsonl import Record
from emoji_rl.lm.models import ModelConfig

if TYPE_CHECKING:
    from emoji_rl.decode.generate import Decoding
    from emoji_rl.game.types import Episode, Game
    from emoji_rl.lm.models import Runtime


@dataclass
class EvalConfig(ModelConfig, Checked):
    """The fields every game's evaluation stage has; a game's stage Config subclasses it with its own
    (and `override`s a default, such as where its held-out records are)."""

    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={
            "help": "systems to compare: `base`, NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter)",
            "input": True,
        },
    )
    compare: list[str] = field(
        default_factory=list,
        metadata={"help": "pairs A:B to report mean(A - B) with a paired interval; none: adjacent systems"},
    )
    data: str = field(default="data/eval.jsonl", metadata={"help": "held-out records, JSONL", "input": True})
    max_examples: int = field(default=0, metadata={"help": "evaluate at most this many records (0 = all)"})
    reference_examples: int = field(
        default=0,
        metadata={
            "help": "systems without an adapter of their own (base, the scripted ones) play only the first N "
            "records (0 = all); adapters play them all. The smallest difference measured is between "
            "adapters (RL - SFT): spend the records there"
        },
    )
    output_dir: str = field(default="reports", metadata={"help": "where the JSON and PNG go"})
    batch_size: int = field(default=32, metadata={"help": "games per generate call", "min": 1})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples per interval", "min": 1})
    seed: int = field(default=0, metadata={"help": "seed for sampling, the game's draws and the bootstrap"})

    result_fields: ClassVar[tuple[str, ...]] = ("model", "seed")
    """The fields a played game depends on, besides the data and the systems: the records log's config
    line. Not `batch_size`: a rerun with a smaller batch after running out of memory may go on from the
    log (a greedy game's record is the same at any batch size, to float rounding)."""

    def system_names(self) -> list[str]:
        """Every system's name, in the report's order; a game with scripted systems names them too."""
        return list(parse_systems(self.systems))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.reference_examples < 0:
            raise ValueError(f"reference_examples={self.reference_examples} must be >= 0 (0 = all records)")
        compare_pairs(self.compare, self.system_names())


@dataclass(frozen=True)
class ModelSender:
    """How a model system samples its turns: its `Decoding` (greedy or at a temperature, under the
    emoji grammar or free text, and for a greedy sender under the grammar, beam search and guidance),
    whose `batch_size` the path sets to the stage's, and guidance's `unconditional` prompt
    (docs/DESIGN.md §2)."""

    decoding: Decoding
    unconditional: Sequence[int] = ()


@dataclass(frozen=True)
class Scripted:
    """A system that is no model: per record, the replies it sends, turn by turn, decided before the
    game (None: it has none for that record, which it then skips). The replies are the system's
    fingerprint in the records log, so a rerun with other replies is another config."""

    replies: Sequence[Sequence[str] | None]
    modes: Collection[str] | None = None
    """The modes it plays (None: all); the others get a row that says `note`."""
    note: str = ""
    kind: ClassVar[str] = "scripted"
    """Beside a model system's `base` or `adapter`: held to `reference_examples` as the base is."""


@dataclass(frozen=True)
class Report:
    """How an evaluation reads: NAME.json's first fields, the printed table, and the PNG."""

    header: Record
    """NAME.json's fields before the rows, comparisons and records: how the games were played."""
    columns: Sequence[str]
    """The printed table's columns, read from the rows (as `cells` prints them)."""
    figure: Sequence[str]
    """The metrics of the PNG, a panel each, bars grouped by `group`, one colour per system."""
    title: str
    group: str = "mode"
    heading: str = ""
    """Printed above the table."""
    note: str | None = None
    """Printed under the comparisons (a caveat not to be missed)."""
    cells: Callable[[Record], Record] = lambda row: row
    """A row as the table prints it (an interval as one text cell)."""


@dataclass
class EvalSetup:
    """What the path plays, built once per run by `Evaluation.setup`."""

    games: Mapping[str, Callable[[Record], Game]]
    """Per mode, in the report's order, a builder of one game from a held-out record."""
    sender: ModelSender
    scripted: Mapping[str, Scripted]
    """The systems that are no model, by name (as `EvalConfig.system_names` names them)."""
    score: Callable[[Sequence[int], Sequence[Episode]], list[Record]]
    """score(indices, episodes): the game's fields of each record played, a batch at a time (the path
    adds its system, mode and id)."""
    report: Report


@dataclass(frozen=True)
class Evaluation:
    """A game's hooks into the evaluation path, held by its `GameSpec`."""

    name: str
    """The report's files: NAME.json, NAME.png and NAME_records.jsonl; the stage is `eval-NAME`."""
    field: str
    """The field of a held-out record the game reads (checked before anything loads)."""
    hint: str
    """How to make the held-out records, named when the file is missing."""
    unit: str
    """What one record is, in the printed lines (`message`, `game`)."""
    setup: Callable[[Any, Sequence[Record], Any, Runtime], EvalSetup]
    """setup(cfg, records, tokenizer, runtime): the games, the senders, the scoring and the report,
    from the stage's whole config (`EvalConfig`'s fields and the game's)."""
    summarize: Callable[[Sequence[Record], Any], Record]
    """summarize(records, cfg): a system's row in one mode, the game's own final metrics."""
    compared: Mapping[str, Metric]
    """Per-record values compared between systems, paired; each one's mean is the row's figure of
    that name."""
    headline: str
    """The `compared` metric the progress bar shows as it plays, and the log line after each row."""

    def values(self, record: Record) -> dict[str, float]:
        """A record's value of each compared metric, as GRPO's held-out evaluation means them over the
        records (`GameSetup.held_out_metrics`)."""
        return {name: float(metric(record)) for name, metric in self.compared.items()}

    def __post_init__(self) -> None:
        if self.headline not in self.compared:
            raise ValueError(f"evaluation {self.name}: headline {self.headline!r} is not a compared metric")
