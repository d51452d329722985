"""`emoji-rl eval-wordle`: Wordle on held-out answers, base vs SFT vs RL side by side (docs/DESIGN.md §9).

Every system plays each held-out answer once (greedy by default), unconstrained, with the same game
and prompts as GRPO; beside them the entropy solver (the SFT teacher) plays the same answers
through the same game. Reported per system: win rate, mean guesses of won games, turns used, format
compliance (share of turns in the strict `<think>…</think><guess>word</guess>` format), consistency
(share of turns whose guess fits all the feedback so far), invalid guesses (no readable word, or a
word not in the list) and repeated guesses, as shares of turns, and the mean reward under the default
weights; win rate, mean guesses, format and consistency with 95% bootstrap intervals over the games
(`ci95`). Writes a table, `wordle.json` and `wordle.png`.

    emoji-rl eval-wordle --systems base sft=runs/wordle_sft/adapter rl=runs/wordle_grpo/adapter
    emoji-rl eval-wordle --model Qwen/Qwen3-4B --systems base sft=DIR rl=DIR --batch_size 128
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from emoji_rl.decode.generate import Decoding
from emoji_rl.decode.sampler import HFSampler
from emoji_rl.decode.senders import parse_systems
from emoji_rl.game.play import play
from emoji_rl.game.types import StepResult
from emoji_rl.games.wordle.game import MAX_TURNS, WordleBuilder, WordleGame, WordleRules
from emoji_rl.games.wordle.solver import EntropySolver
from emoji_rl.io.jsonl import read_jsonl, write_json
from emoji_rl.io.report import bar_figure, format_table
from emoji_rl.lm import models, template
from emoji_rl.lm.adapters import active_system, load_systems

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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


@dataclass
class Config(models.ModelConfig):
    """Evaluate Wordle players on held-out answers: base vs SFT vs RL."""

    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={
            "help": "systems to compare: `base`, or NAME=ADAPTER_DIR (e.g. sft=runs/wordle_sft/adapter)"
        },
    )
    data: str = field(
        default="data/wordle/wordle_rl_eval.jsonl",
        metadata={"help": "held-out answers, JSONL with `answer` (`emoji-rl wordle-data` writes it)"},
    )
    max_examples: int = field(default=0, metadata={"help": "evaluate at most this many answers (0 = all)"})
    output_dir: str = field(default="reports/wordle", metadata={"help": "where the JSON and PNG go"})
    max_turns: int = field(default=MAX_TURNS, metadata={"help": "guesses per game"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature; 0 = greedy"})
    max_new_tokens: int = field(
        default=128,
        metadata={"help": "token budget of one reply (<think> + <guess>); a cut-off reply is invalid"},
    )
    batch_size: int = field(default=32, metadata={"help": "games per generate call"})
    seed: int = field(default=0, metadata={"help": "sampling seed, and the bootstrap's"})
    solver: bool = field(
        default=True, metadata={"help": "add the entropy solver's row (the SFT teacher, same game)"}
    )
    bootstrap: int = field(
        default=1000, metadata={"help": "bootstrap resamples of the games for the 95% intervals"}
    )

    def __post_init__(self) -> None:
        parse_systems(self.systems)
        if SOLVER in parse_systems(self.systems):
            raise ValueError(f"`{SOLVER}` names the entropy solver's row: give the system another name")
        if self.bootstrap < 1:
            raise ValueError(f"bootstrap={self.bootstrap} must be >= 1")


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


async def solver_finals(games: Sequence[WordleGame], tokenizer: PreTrainedTokenizerBase) -> list[StepResult]:
    """The entropy solver's replies played through each game: the row the trained players are read against."""
    solver = EntropySolver(games[0].words)
    stop = template.stop_token_id(tokenizer)
    finals = []
    for game in games:
        await game.start()
        for turn in solver.play(game.answer, game.rules.max_turns):
            result = await game.step((*tokenizer(turn.reply, add_special_tokens=False)["input_ids"], stop))
        finals.append(result)
    return finals


def row(name: str, finals: Sequence[StepResult], cfg: Config) -> dict[str, object]:
    return {"system": name, **summarize(finals), "ci95": intervals(finals, cfg.bootstrap, cfg.seed)}


def main(cfg: Config) -> None:
    torch.manual_seed(cfg.seed)
    records = read_jsonl(cfg.data, hint="make it with `emoji-rl wordle-data` (it writes the held-out split)")
    if cfg.max_examples:
        records = records[: cfg.max_examples]
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    systems = parse_systems(cfg.systems)
    model = load_systems(models.load_causal_lm(cfg.model, runtime), systems)
    sampler = HFSampler(
        model, tokenizer, Decoding("none", cfg.temperature, cfg.max_new_tokens, cfg.batch_size)
    )
    builder = WordleBuilder(tokenizer, WordleRules(max_turns=cfg.max_turns))
    rows = []
    for name, adapter in systems.items():
        with active_system(model, name, adapter):
            episodes = asyncio.run(play([builder(r) for r in records], sampler))
        rows.append(row(name, [e.turns[-1].result for e in episodes], cfg))
        print(f"eval-wordle: {name}: win rate {rows[-1]['win_rate']:.3f}", flush=True)
    if cfg.solver:
        rows.append(row(SOLVER, asyncio.run(solver_finals([builder(r) for r in records], tokenizer)), cfg))
    out = Path(cfg.output_dir)
    write_json(
        out / "wordle.json", {"model": cfg.model, "data": cfg.data, "games": len(records), "rows": rows}
    )
    figure = bar_figure(
        rows,
        ["win_rate", "format", "consistent", "invalid", "repeated"],
        group="system",
        series="system",
        title=f"Wordle, {len(records)} held-out answers",
        path=out / "wordle.png",
    )
    table = [{**r, **{f"{k} 95%": _span(r["ci95"][k]) for k in INTERVALS}} for r in rows]
    columns = [name for c in COLUMNS for name in ((c, f"{c} 95%") if c in INTERVALS else (c,))]
    print(f"\n{format_table(table, columns)}\n\nreport: {out / 'wordle.json'}\nplot:   {figure}")


def _span(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.2f}, {interval[1]:.2f}]"
