"""What `emoji-rl grpo --game reader` plays (docs/DESIGN.md §13): the policy reads the teacher's emoji
for each message of an SFT split (`emoji-rl teacher` writes data/sft_{train,test}.jsonl) and writes its
guess in free text; a frozen sender adds emoji after each wrong guess; MiniLM scores the final guess,
less the contrast term. Its fields beside the trainer's: the game's length, threshold and view, the
sender (`partner_*`), the embedder and the contrast term."""

from __future__ import annotations

from dataclasses import dataclass

from emoji_rl.game.registry import GameContext, GameSpec
from emoji_rl.game.similarity import ContrastConfig, SimilarityConfig
from emoji_rl.game.types import GameSetup, Record
from emoji_rl.games.reader.evaluation import EVALUATION
from emoji_rl.games.reader.game import ReaderConfig
from emoji_rl.games.reader.partner import PartnerConfig
from emoji_rl.games.reader.records import read_reader_records


@dataclass
class Config(ReaderConfig, PartnerConfig, SimilarityConfig, ContrastConfig):
    """The reader game's GRPO fields: train_data is an SFT split (`target`, and the teacher's emoji as
    the last assistant turn of `messages`)."""

    def read_records(self, path: str) -> list[Record]:
        return read_reader_records(path, self.min_emoji, self.max_emoji)  # type: ignore[attr-defined]


def setup(cfg, context: GameContext) -> GameSetup:
    from emoji_rl.game.similarity import GuessScorer, Similarity
    from emoji_rl.games.reader.game import ReaderBuilder, ReaderRules
    from emoji_rl.lm import models

    records = cfg.read_records(cfg.train_data)
    partner = cfg.build_partner(
        context.runtime,
        model=cfg.model,
        url=cfg.vllm_url,
        served_name=cfg.vllm_served_name,
        min_emoji=cfg.min_emoji,
        max_emoji=cfg.max_emoji,
    )
    similarity = Similarity(models.load_embedder(cfg.similarity_model, device=context.runtime.device))
    background = cfg.background(similarity, [r["target"] for r in records], cfg.seed)
    rules = ReaderRules(cfg.max_turns, cfg.tau, cfg.reader_view, cfg.contrast)
    builder = ReaderBuilder(context.tokenizer, partner, GuessScorer(similarity, background), rules)
    return GameSetup(
        builder,
        records,
        None,
        f"reader ({cfg.reader_view} view), sender {partner.describe()}",
        target=lambda record: record["target"],
        headline=("sim", "game/similarity"),
        seconds=lambda: builder.seconds,
        servers={"partner": partner.completer.endpoint} if partner.completer.endpoint else {},
    )


GAME = GameSpec(
    "reader",
    "the policy reads the teacher's emoji and guesses the message in words; a frozen sender adds emoji "
    "after each wrong guess; MiniLM scores the final guess",
    Config,
    setup,
    EVALUATION,
)
