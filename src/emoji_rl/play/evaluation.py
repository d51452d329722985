"""How a game's evaluation reports (`Evaluation`, on its `GameSpec`), and the fields every evaluation
has (`EvalConfig`): what `emoji-rl eval --game NAME` (play/evaluate.py) reads of a game beside what
the game's setup builds, the same setup as training's.

The path plays systems x held-out records through the game, in each of the game's modes, keeps one
record per game, and reports each system's row of the game's own final metrics and paired bootstrap
intervals of the differences between systems. A system is a model (`base`, or NAME=ADAPTER_DIR) or a
`Scripted` one, whose replies follow from the records alone (a teacher's answers, random answers, a
solver's moves). The hooks build no service (the judge, the similarity, the rules are the setup's):
they say how a model system samples, which scripted systems there are, what a played game keeps and
how the report reads. How a game adds its evaluation: docs/EVALUATION.md, "A game's evaluation". The
path names no game (tests/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from emoji_rl.config import Checked, override
from emoji_rl.decode.generate import SamplingConfig
from emoji_rl.decode.senders import parse_systems
from emoji_rl.io.endpoint import ServerWaitConfig
from emoji_rl.io.jsonl import Record
from emoji_rl.lm.models import ModelConfig
from emoji_rl.play.compare import Metric, compare_pairs

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.decode.generate import Decoding
    from emoji_rl.play.types import Episode, GameSetup


@dataclass
class EvalConfig(SamplingConfig, ModelConfig, ServerWaitConfig):
    """The fields every evaluation has (`emoji-rl eval --game NAME`); a game's evaluation adds its own
    beside the game's (`Evaluation.config`, which may change a default, such as where its held-out
    records are)."""

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
    # Greedy: a system is measured by what it means most, the same for every run.
    temperature: float = override(
        SamplingConfig, "temperature", 0.0, help="a model system's sampling temperature; 0 = greedy"
    )

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


@dataclass
class EvalOptions(Checked):
    """An evaluation's own fields, beside every evaluation's (`EvalConfig`) and the game's: none here.
    A game's evaluation subclasses it with its own, or redeclares a default of theirs (`override`)."""


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
class EvalPlan:
    """How an evaluation plays and reports, given the game its setup built (`Evaluation.plan`)."""

    sender: ModelSender
    score: Callable[[Sequence[int], Sequence[Episode]], list[Record]]
    """score(indices, episodes): the game's fields of each record played, a batch at a time (the path
    adds its system, mode and id)."""
    report: Report
    scripted: Mapping[str, Scripted] = field(default_factory=dict)
    """The systems that are no model, by name (as `EvalConfig.system_names` names them)."""
    modes: Sequence[str] = ()
    """The game's modes played (`GameSetup.games`), in the report's order; none: all of them."""


def game_record(episode: Episode) -> Record:
    """What a played game keeps unless its evaluation says otherwise: each turn's log, the reward and
    the final turn's metrics."""
    final = episode.turns[-1].result
    return {
        "turns": [dict(turn.result.log) for turn in episode.turns],
        "reward": final.reward,
        "metrics": final.metrics,
    }


def compared_means(compared: Mapping[str, Metric]) -> Callable[[Sequence[Record], EvalConfig], Record]:
    """A row that is the mean of each compared metric over the system's records."""

    def row(records: Sequence[Record], cfg: EvalConfig) -> Record:
        return {
            name: sum(float(metric(r)) for r in records) / len(records) for name, metric in compared.items()
        }

    return row


@dataclass(frozen=True)
class Evaluation:
    """How `emoji-rl eval --game NAME` reports a game, held by its `GameSpec`. The smallest one names
    the per-record metrics it compares and its headline (docs/ARCHITECTURE.md, "Write a game")."""

    unit: str
    """What one record is, in the printed lines (`message`, `game`)."""
    compared: Mapping[str, Metric]
    """Per-record values compared between systems, paired; each one's mean is the row's figure of
    that name."""
    headline: str
    """The `compared` metric the progress bar shows as it plays, and the log line after each row."""
    plan: Callable[[EvalConfig, GameSetup, Sequence[Record], PreTrainedTokenizerBase], EvalPlan] | None = None
    """plan(cfg, game, records, tokenizer): how a model system samples, the scripted systems, what a
    played game keeps, the report, and the modes played; from the stage's whole config (`EvalConfig`'s
    fields, the game's and `config`'s), the game as its setup built it, and the held-out records.
    None: `plain_plan`."""
    summarize: Callable[[Sequence[Record], EvalConfig], Record] | None = None
    """summarize(records, cfg): a system's row in one mode (None: the mean of each compared metric)."""
    config: type[Checked] = EvalOptions
    """The evaluation's own fields, and the defaults it changes of every evaluation's or the game's
    (its docstring heads `--help`)."""

    def prepare(
        self, cfg: EvalConfig, game: GameSetup, records: Sequence[Record], tokenizer: PreTrainedTokenizerBase
    ) -> EvalPlan:
        """How the evaluation plays and reports `game` on `records` (`plan`, or `plain_plan`)."""
        if self.plan is not None:
            return self.plan(cfg, game, records, tokenizer)
        return self.plain_plan(cfg, game, records)

    def plain_plan(self, cfg: EvalConfig, game: GameSetup, records: Sequence[Record]) -> EvalPlan:
        """How a game with no plan of its own is evaluated: a model system samples as grpo's policy
        does (the game's constraint) at the evaluation's temperature; each game keeps its target and
        `game_record`; the table's columns and the figure's panels are the compared metrics."""
        return EvalPlan(
            ModelSender(cfg.decoding(constraint=game.constraint)),
            lambda indices, episodes: [
                {"target": game.target(records[i]), **game_record(e)}
                for i, e in zip(indices, episodes, strict=True)
            ],
            Report(
                header={"model": cfg.model, "data": cfg.data, "examples": len(records)},
                columns=["system", "mode", "n", *self.compared],
                figure=list(self.compared),
                title=f"{game.description}, {len(records)} held-out records",
            ),
        )

    def row(self, records: Sequence[Record], cfg: EvalConfig) -> Record:
        """A system's row in one mode."""
        return (self.summarize or compared_means(self.compared))(records, cfg)

    def values(self, record: Record) -> dict[str, float]:
        """A record's value of each compared metric, as GRPO's held-out evaluation means them over the
        records (`GameSetup.held_out_metrics`)."""
        return {name: float(metric(record)) for name, metric in self.compared.items()}

    def __post_init__(self) -> None:
        if self.headline not in self.compared:
            raise ValueError(f"evaluation headline {self.headline!r} is not a compared metric")
