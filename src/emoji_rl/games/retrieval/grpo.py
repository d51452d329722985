"""What `emoji-rl grpo --game retrieval` plays (docs/DESIGN.md §3): the sender answers each training
target in emoji under the grammar, a frozen judge guesses the target from them, and MiniLM scores the
guess. Its fields beside the trainer's: the game's length and threshold, the judge, the embedder and
the reward's weights."""

from __future__ import annotations

from dataclasses import dataclass, field

from emoji_rl.game.registry import GameContext, GameSpec
from emoji_rl.game.similarity import ContrastConfig, SimilarityConfig
from emoji_rl.game.types import GameSetup, Record
from emoji_rl.games.retrieval.evaluation import EVALUATION, held_out_metrics
from emoji_rl.games.retrieval.game import RetrievalConfig
from emoji_rl.games.retrieval.judge_config import JudgeConfig
from emoji_rl.io.jsonl import read_records


@dataclass
class Config(RetrievalConfig, JudgeConfig, SimilarityConfig, ContrastConfig):
    """The retrieval game's GRPO fields: train_data holds `target` (emoji-rl rl-prompts)."""

    success_bonus: float = field(default=0.5, metadata={"help": "reward added when similarity >= tau"})
    turn_cost: float = field(default=0.1, metadata={"help": "reward subtracted per turn used"})
    format_penalty: float = field(default=0.5, metadata={"help": "reward subtracted for an invalid turn"})
    repetition_penalty: float = field(
        default=0.3, metadata={"help": "times (1 - unique/total emoji); the original: none"}
    )

    def read_records(self, path: str) -> list[Record]:
        return read_records(path, "target", "make it with `emoji-rl rl-prompts`")


def setup(cfg, context: GameContext) -> GameSetup:
    from emoji_rl.emoji.constraint import compile_emoji_grammar
    from emoji_rl.game.similarity import Similarity
    from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules
    from emoji_rl.games.retrieval.reward import RewardWeights
    from emoji_rl.lm import models

    records = cfg.read_records(cfg.train_data)
    constraint = compile_emoji_grammar(
        context.tokenizer, cfg.min_emoji, cfg.max_emoji, vocab_size=context.vocab_size
    )
    judge = cfg.build_judge(context.runtime)
    similarity = Similarity(models.load_embedder(cfg.similarity_model, device=context.runtime.device))
    weights = RewardWeights(
        cfg.success_bonus, cfg.turn_cost, cfg.format_penalty, cfg.repetition_penalty, cfg.contrast
    )
    rules = RetrievalRules(cfg.max_turns, cfg.tau, cfg.min_emoji, cfg.max_emoji, weights)
    background = cfg.background(similarity, [r["target"] for r in records], cfg.seed)
    builder = RetrievalBuilder(context.tokenizer, judge, similarity, rules, background)
    return GameSetup(
        builder,
        records,
        constraint,
        f"retrieval, judge {judge.describe()}",
        target=lambda record: record["target"],
        headline=("sim", "game/similarity"),
        seconds=lambda: dict(builder.seconds),
        held_out_metrics=held_out_metrics(similarity, cfg.seed),
        servers={"judge": judge.endpoint} if judge.endpoint else {},
    )


GAME = GameSpec(
    "retrieval",
    "the sender writes emoji, a frozen judge guesses the message, MiniLM scores the guess",
    Config,
    setup,
    EVALUATION,
)
