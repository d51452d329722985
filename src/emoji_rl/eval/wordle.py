"""`emoji-rl eval-wordle`: Wordle on held-out answers, base vs SFT vs RL side by side (docs/DESIGN.md §9).

Every system plays each held-out answer once (greedy by default), unconstrained, with the same game
and prompts as GRPO. Reported per system: win rate, mean guesses of won games, turns used, format
compliance (share of turns in the strict `<think>…</think><guess>word</guess>` format), invalid
guesses (no readable word, or a word not in the list) and repeated guesses, as shares of turns, and
the mean reward under the default weights. Writes a table, `wordle.json` and `wordle.png`.

    emoji-rl eval-wordle --systems base sft=runs/wordle_sft/adapter rl=runs/wordle_grpo/adapter
    emoji-rl eval-wordle --model Qwen/Qwen3-4B --systems base sft=DIR rl=DIR --batch_size 128
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from emoji_rl import models
from emoji_rl.data.jsonl import read_jsonl, write_json
from emoji_rl.eval.report import bar_figure, format_table
from emoji_rl.eval.retrieval import active_system, load_systems, parse_systems
from emoji_rl.rl.games.wordle import MAX_TURNS, WordleBuilder, WordleRules
from emoji_rl.rl.rollout.hf import HFSampler
from emoji_rl.rl.rollout.play import play
from emoji_rl.rl.types import Episode

COLUMNS = ("system", "win_rate", "mean_guesses", "turns", "format", "invalid", "repeated", "reward")


@dataclass
class Config:
    """Evaluate Wordle players on held-out answers: base vs SFT vs RL."""

    model: str = field(default=models.SMOLLM2, metadata={"help": "base model spec of every system"})
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
    seed: int = field(default=0, metadata={"help": "sampling seed"})

    def __post_init__(self) -> None:
        parse_systems(self.systems)


def summarize(episodes: Sequence[Episode]) -> dict[str, float | None]:
    """Per-game rates come from the final StepResult; turn shares are weighted by turns played."""
    finals = [e.turns[-1].result.metrics for e in episodes]
    turns = [m["turns"] for m in finals]
    won = [m["turns"] for m in finals if m["won"]]

    def per_turn(key: str) -> float:
        return sum(m[key] * m["turns"] for m in finals) / sum(turns)

    return {
        "win_rate": len(won) / len(finals),
        "mean_guesses": sum(won) / len(won) if won else None,
        "turns": sum(turns) / len(turns),
        "format": per_turn("format_rate"),
        "invalid": per_turn("invalid_rate"),
        "repeated": per_turn("repeat_rate"),
        "reward": sum(e.reward for e in episodes) / len(episodes),
    }


def main(cfg: Config) -> None:
    torch.manual_seed(cfg.seed)
    records = read_jsonl(cfg.data, hint="make it with `emoji-rl wordle-data` (it writes the held-out split)")
    if cfg.max_examples:
        records = records[: cfg.max_examples]
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    systems = parse_systems(cfg.systems)
    model = load_systems(models.load_causal_lm(cfg.model, runtime), systems)
    sampler = HFSampler(model, tokenizer, "none", cfg.temperature, cfg.max_new_tokens, cfg.batch_size)
    builder = WordleBuilder(tokenizer, WordleRules(max_turns=cfg.max_turns))
    rows = []
    for name, adapter in systems.items():
        with active_system(model, name, adapter):
            episodes = asyncio.run(play([builder(r) for r in records], sampler))
        rows.append({"system": name, **summarize(episodes)})
        print(f"eval-wordle: {name}: win rate {rows[-1]['win_rate']:.3f}", flush=True)
    out = Path(cfg.output_dir)
    write_json(
        out / "wordle.json", {"model": cfg.model, "data": cfg.data, "games": len(records), "rows": rows}
    )
    figure = bar_figure(
        rows,
        ["win_rate", "format", "invalid", "repeated"],
        group="system",
        series="system",
        title=f"Wordle, {len(records)} held-out answers",
        path=out / "wordle.png",
    )
    print(f"\n{format_table(rows, COLUMNS)}\n\nreport: {out / 'wordle.json'}\nplot:   {figure}")
