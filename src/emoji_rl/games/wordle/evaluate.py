"""`emoji-rl eval-wordle`: Wordle on held-out answers, base vs SFT vs RL side by side (docs/DESIGN.md §9),
beside the entropy solver (the SFT teacher) played through the same game; the evaluation path is
game/evaluate.py, this game's part of it games/wordle/evaluation.py.

Every system plays each held-out answer once (greedy by default), unconstrained, with the same game
and prompts as GRPO. Reported per system: win rate, mean guesses of won games, turns used, format
compliance, consistency with the feedback, invalid and repeated guesses, and the mean reward; win
rate, mean guesses, format and consistency with 95% bootstrap intervals over the games (`ci95`), and
`--compare A:B` (default: each adjacent pair) the paired differences of win rate, turns and reward.
Writes a table, `wordle.json` and `wordle.png`; each game is appended to `wordle_records.jsonl` as
its batch ends, so a rerun plays only the games missing there.

    emoji-rl eval-wordle --systems base sft=runs/wordle_sft/adapter rl=runs/wordle_grpo/adapter
    emoji-rl eval-wordle --model Qwen/Qwen3-4B --systems base sft=DIR rl=DIR --batch_size 128
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emoji_rl.config import override
from emoji_rl.decode.senders import parse_systems
from emoji_rl.game.evaluate import evaluate
from emoji_rl.game.evaluation import EvalConfig
from emoji_rl.games.wordle.evaluation import SOLVER
from emoji_rl.games.wordle.game import MAX_TURNS
from emoji_rl.games.wordle.grpo import GAME


@dataclass
class Config(EvalConfig):
    """Evaluate Wordle players on held-out answers: base vs SFT vs RL."""

    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={
            "help": "systems to compare: `base`, or NAME=ADAPTER_DIR (e.g. sft=runs/wordle_sft/adapter)",
            "input": True,
        },
    )
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
    max_turns: int = field(default=MAX_TURNS, metadata={"help": "guesses per game", "min": 1})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature; 0 = greedy", "min": 0.0})
    max_new_tokens: int = field(
        default=128,
        metadata={
            "help": "token budget of one reply (<think> + <guess>); a cut-off reply is invalid",
            "min": 1,
        },
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


def main(cfg: Config) -> None:
    evaluate(GAME, cfg)
