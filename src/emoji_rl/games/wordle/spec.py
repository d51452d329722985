"""Wordle (docs/DESIGN.md §9), as `emoji-rl grpo` trains it and `emoji-rl eval` reports it: one game
per `{"answer"}` record, free text (no grammar), the Wordle reward terms, and a curriculum that moves
weight from format to strategy once format compliance reaches its threshold. The trainer feeds the curriculum each step's
episodes of every process (`GameSetup.observe`), so every process takes the same decisions; its phase
and window are checkpointed (`GameSetup.state`), so a resumed run goes on in the same phase."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from emoji_rl.config import override
from emoji_rl.games.wordle.evaluation import EVALUATION, game_record
from emoji_rl.games.wordle.game import MAX_TURNS
from emoji_rl.io.jsonl import read_records
from emoji_rl.play.spec import GameConfig, GameContext, GameSpec, RunSettings
from emoji_rl.play.types import EpisodeGroup, GameSetup, Record


@dataclass
class Config(GameConfig):
    """Wordle's fields: its records hold `answer` (emoji-rl wordle-data)."""

    max_turns: int = override(GameConfig, "max_turns", MAX_TURNS, help="guesses before the game is lost")
    curriculum: bool = field(
        default=True, metadata={"help": "lower format and raise strategy weights once format is learned"}
    )
    curriculum_threshold: float = field(
        default=0.9, metadata={"help": "strict-format rate that starts the strategy phase (seed 003 §14)"}
    )
    curriculum_window: int = field(default=64, metadata={"help": "episodes the format rate is taken over"})

    def read_records(self, path: str, stage: RunSettings) -> list[Record]:
        return read_records(path, "answer", "make it with `emoji-rl wordle-data`")

    def off_policy_blocker(self) -> str | None:
        if self.curriculum:
            return (
                "Wordle's curriculum learns from each step's games, which would then be built before it "
                "saw the last step's (set curriculum false, or max_off_policy_steps 0)"
            )
        return None


def setup(cfg: Config, context: GameContext) -> GameSetup:
    from emoji_rl.games.wordle.game import WordleBuilder, WordleRules
    from emoji_rl.games.wordle.reward import Curriculum, CurriculumTracker

    records = context.records
    curriculum = Curriculum(threshold=cfg.curriculum_threshold, window=cfg.curriculum_window)
    tracker = CurriculumTracker(curriculum) if cfg.curriculum else None
    builder = WordleBuilder(context.tokenizer, WordleRules(max_turns=cfg.max_turns), tracker)
    game = GameSetup(
        builder,
        records,
        "none",
        "wordle",
        target=lambda record: record["answer"],
        headline=("won", "game/won"),
        # eval-wordle's compared metrics: its win rate is no final metric of the game (`won` is)
        held_out_metrics=lambda records, indices, episodes: [
            EVALUATION.values(game_record(e)) for e in episodes
        ],
    )
    if tracker is None:
        return game

    def observe(groups: Sequence[EpisodeGroup]) -> None:
        for group in groups:
            for episode in group.episodes:
                tracker.record(episode.turns[-1].result.metrics["format_rate"])

    game.description, game.state, game.observe = "wordle with curriculum", tracker, observe
    return game


GAME = GameSpec(
    "wordle",
    "the policy guesses a five-letter word in six tries from the board's feedback",
    Config,
    setup,
    EVALUATION,
)
