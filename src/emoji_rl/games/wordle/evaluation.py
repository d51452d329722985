"""How `emoji-rl eval --game wordle` (`eval-wordle`) reports Wordle: base vs SFT vs RL on held-out
answers, side by side, beside the entropy solver (the SFT teacher, `solver`), which plays the same
answers through the same game, its replies fixed by each answer. One mode, the whole game (`multi`),
played unconstrained with the game and prompts GRPO plays (the setup's, spec.py), under the default
reward weights (the curriculum off).

A record keeps each turn's guess and feedback, the final reward and the final metrics. A row: win
rate, mean guesses of won games, turns used, format compliance (share of turns in the strict
`<think>…</think><guess>word</guess>` format), consistency (share of turns whose guess fits all the
feedback so far), invalid guesses (no readable word, or a word not in the list) and repeated
guesses, as shares of turns, and the mean reward under the default weights; win rate, mean guesses,
format and consistency with 95% bootstrap intervals over the games (`ci95`). Compared between
systems, game by game: won, turns and reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from emoji_rl.config import override
from emoji_rl.decode.generate import SamplingConfig
from emoji_rl.decode.senders import parse_systems
from emoji_rl.io.jsonl import Record
from emoji_rl.play.evaluation import (
    EvalConfig,
    EvalOptions,
    EvalPlan,
    Evaluation,
    ModelSender,
    Report,
    Scripted,
)
from emoji_rl.play.types import StepResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.games.wordle.game import WordleBuilder
    from emoji_rl.play.types import Episode, GameSetup

COLUMNS = (
    "system",
    "win_rate",
    "mean_guesses",
    "turns",
    "format",
    "consistent",
    "invalid",
    "repeated",
    "reward",
)
INTERVALS = ("win_rate", "mean_guesses", "format", "consistent")
SOLVER = "solver"


def summarize(finals: Sequence[StepResult]) -> dict[str, float | None]:
    """Rates from each game's final StepResult; turn shares are weighted by turns played."""
    metrics = [f.metrics for f in finals]
    turns = [m["turns"] for m in metrics]
    won = [m["turns"] for m in metrics if m["won"]]

    def per_turn(key: str) -> float:
        return sum(m[key] * m["turns"] for m in metrics) / sum(turns)

    return {
        "win_rate": len(won) / len(metrics),
        "mean_guesses": sum(won) / len(won) if won else None,
        "turns": sum(turns) / len(turns),
        "format": per_turn("format_rate"),
        "consistent": per_turn("consistent_rate"),
        "invalid": per_turn("invalid_rate"),
        "repeated": per_turn("repeat_rate"),
        "reward": sum(f.reward for f in finals) / len(finals),
    }


def intervals(finals: Sequence[StepResult], n: int, seed: int) -> dict[str, list[float] | None]:
    """95% percentile-bootstrap intervals of the INTERVALS statistics, resampling whole games."""
    rng = np.random.default_rng(seed)
    draws: dict[str, list[float]] = {key: [] for key in INTERVALS}
    for _ in range(n):
        sample = summarize([finals[i] for i in rng.integers(0, len(finals), len(finals))])
        for key in INTERVALS:
            if sample[key] is not None:
                draws[key].append(float(sample[key]))
    return {key: np.percentile(v, [2.5, 97.5]).tolist() if v else None for key, v in draws.items()}


def solver_replies(builder: WordleBuilder, records: Sequence[Record]) -> list[list[str]]:
    """The entropy solver's replies to each record's answer, turn by turn: the row the trained players
    are read against, played through the same game as theirs."""
    from emoji_rl.games.wordle.solver import EntropySolver

    solver = EntropySolver(builder.words)
    return [[turn.reply for turn in solver.play(builder(r).answer, builder.rules.max_turns)] for r in records]


def game_record(episode: Episode) -> Record:
    """One answer's game: each turn's guess and the board line it got, the final reward and metrics."""
    final = episode.turns[-1].result
    return {
        "answer": final.log["answer"],
        "turns": [{k: turn.result.log[k] for k in ("guess", "feedback")} for turn in episode.turns],
        "reward": final.reward,
        "metrics": final.metrics,
    }


def final(record: Record) -> StepResult:
    """A record's final result, as the game returned it."""
    return StepResult(True, record["reward"], metrics=record["metrics"])


def row(records: Sequence[Record], cfg: EvalConfig) -> Record:
    finals = [final(r) for r in records]
    return {**summarize(finals), "ci95": intervals(finals, cfg.resamples, cfg.seed)}


def _span(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"


def plan(
    cfg: EvalConfig, game: GameSetup, records: Sequence[Record], tokenizer: PreTrainedTokenizerBase
) -> EvalPlan:
    from emoji_rl.decode.generate import Decoding
    from emoji_rl.games.wordle.game import WordleBuilder

    builder = game.make_env
    assert isinstance(builder, WordleBuilder), builder
    report = Report(
        header={"model": cfg.model, "data": cfg.data, "games": len(records)},
        columns=[name for c in COLUMNS for name in ((c, f"{c} 95%") if c in INTERVALS else (c,))],
        figure=["win_rate", "format", "consistent", "invalid", "repeated"],
        title=f"Wordle, {len(records)} held-out answers",
        group="system",
        cells=lambda row: {**row, **{f"{k} 95%": _span(row["ci95"][k]) for k in INTERVALS}},
    )
    return EvalPlan(
        ModelSender(Decoding("none", cfg.temperature, cfg.max_new_tokens)),
        lambda indices, episodes: [game_record(e) for e in episodes],
        report,
        {SOLVER: Scripted(solver_replies(builder, records))} if cfg.solver else {},
    )


@dataclass
class Options(EvalOptions):
    """Evaluate Wordle players on held-out answers: base vs SFT vs RL."""

    data: str = override(
        EvalConfig,
        "data",
        "data/wordle/wordle_rl_eval.jsonl",
        help="held-out answers, JSONL with `answer` (`emoji-rl wordle-data` writes it)",
    )
    output_dir: str = override(EvalConfig, "output_dir", "reports/wordle")
    resamples: int = override(
        EvalConfig,
        "resamples",
        1000,
        help="bootstrap resamples of the games for the 95% intervals",
        aliases=("bootstrap",),
    )
    max_new_tokens: int = override(
        SamplingConfig,
        "max_new_tokens",
        128,
        help="token budget of one reply (<think> + <guess>); a cut-off reply is invalid",
    )
    # The rows read every system's reward under the same weights: the default ones, not a phase of
    # a curriculum that learns from no step here.
    curriculum: bool = field(
        default=False, metadata={"help": "the curriculum's weights; an evaluation reads the default ones"}
    )
    solver: bool = field(
        default=True,
        metadata={"help": f"add the entropy solver's row `{SOLVER}` (the SFT teacher, same game)"},
    )

    result_fields = ("model", "max_turns", "temperature", "max_new_tokens", "seed")

    def system_names(self) -> list[str]:
        names = list(parse_systems(self.systems))
        if SOLVER in names:
            raise ValueError(f"`{SOLVER}` names the entropy solver's row: give the system another name")
        return [*names, *([SOLVER] if self.solver else [])]


EVALUATION = Evaluation(
    unit="game",
    compared={
        "win_rate": lambda record: record["metrics"]["won"],
        "turns": lambda record: record["metrics"]["turns"],
        "reward": lambda record: record["reward"],
    },
    headline="win_rate",
    plan=plan,
    summarize=row,
    config=Options,
)
