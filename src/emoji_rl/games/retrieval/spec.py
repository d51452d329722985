"""The retrieval game (docs/DESIGN.md §3), as `emoji-rl grpo` trains it and `emoji-rl eval` reports
it: the sender answers each target in emoji under the grammar, a frozen judge guesses the target from
them, and MiniLM scores the guess. Its fields: the game's length and threshold, the judge, the
embedder and the reward's weights; its setup builds the judge, the similarity and the rules once, for
the training game and for the evaluation's two modes (`single`: one message, one guess) alike."""

from __future__ import annotations

from dataclasses import dataclass, replace

from emoji_rl.games.retrieval.evaluation import EVALUATION, held_out_metrics
from emoji_rl.games.retrieval.game import RetrievalConfig
from emoji_rl.io.jsonl import read_records
from emoji_rl.play.judge_config import JudgeFields
from emoji_rl.play.reward import SenderRewardConfig
from emoji_rl.play.similarity import ContrastConfig, SimilarityConfig
from emoji_rl.play.spec import GameContext, GameSpec, RunSettings
from emoji_rl.play.types import GameSetup, Record


@dataclass
class Config(RetrievalConfig, JudgeFields, SimilarityConfig, ContrastConfig, SenderRewardConfig):
    """The retrieval game's fields: its records hold `target` (emoji-rl rl-prompts)."""

    def read_records(self, path: str, stage: RunSettings) -> list[Record]:
        return read_records(
            path, "target", "make it with `emoji-rl rl-prompts` (it writes the held-out split too)"
        )

    def wait_for_servers(self, wait_s: float) -> None:
        self.wait_for_judge_server(wait_s)


def setup(cfg: Config, context: GameContext) -> GameSetup:
    from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules

    records = context.records
    judge = cfg.make_judge(context.runtime, context.server_wait_s)
    similarity = cfg.load_similarity(context.runtime)
    weights = cfg.reward_weights(cfg.contrast)
    rules = RetrievalRules(cfg.max_turns, cfg.tau, context.min_emoji, context.max_emoji, weights)
    background = cfg.background(similarity, [r["target"] for r in records], context.seed)
    builder = RetrievalBuilder(context.tokenizer, judge, similarity, rules, background)
    single = RetrievalBuilder(context.tokenizer, judge, similarity, replace(rules, max_turns=1), background)
    return GameSetup(
        builder,
        records,
        "grammar",
        f"retrieval, judge {judge.describe()}",
        target=lambda record: record["target"],
        headline=("sim", "game/similarity"),
        seconds=lambda: dict(builder.seconds),
        held_out_metrics=held_out_metrics(similarity, context.seed),
        servers={"judge": judge.endpoint} if judge.endpoint else {},
        modes={"single": single, "multi": builder},
    )


GAME = GameSpec(
    "retrieval",
    "the sender writes emoji, a frozen judge guesses the message, MiniLM scores the guess",
    Config,
    setup,
    EVALUATION,
)
