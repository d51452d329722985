"""The reader's seat (docs/DESIGN.md §13), as `emoji-rl grpo` trains it and `emoji-rl eval` reports
it: the policy reads the teacher's emoji for each message of an SFT split (`emoji-rl teacher` writes
data/sft_{train,test}.jsonl) and writes its guess in free text; a frozen sender adds emoji after each
wrong guess; MiniLM scores the final guess, less the contrast term. Its fields: the game's length,
threshold and view, the sender (`partner_*`), the embedder and the contrast term; its setup builds
the sender and the similarity once, for training and evaluation alike."""

from __future__ import annotations

from dataclasses import dataclass

from emoji_rl.errors import UserError
from emoji_rl.games.reader.evaluation import EVALUATION
from emoji_rl.games.reader.game import ReaderConfig
from emoji_rl.games.reader.partner import PartnerConfig
from emoji_rl.games.reader.records import read_reader_records
from emoji_rl.play.similarity import ContrastConfig, SimilarityConfig
from emoji_rl.play.spec import GameContext, GameSpec, RunSettings
from emoji_rl.play.types import GameSetup, Record


@dataclass
class Config(ReaderConfig, PartnerConfig, SimilarityConfig, ContrastConfig):
    """The reader game's fields: its records are an SFT split (`target`, and the teacher's emoji as
    the last assistant turn of `messages`)."""

    def read_records(self, path: str, stage: RunSettings) -> list[Record]:
        return read_reader_records(path, stage.min_emoji, stage.max_emoji)


def setup(cfg: Config, context: GameContext) -> GameSetup:
    from emoji_rl.games.reader.game import ReaderBuilder, ReaderRules
    from emoji_rl.play.similarity import GuessScorer

    records = context.records
    server = context.policy_server
    if cfg.partner == "openai" and server is None and (cfg.partner_url is None or cfg.partner_model is None):
        raise UserError(
            "partner=openai needs partner_url and partner_model: the policy samples in this process, so "
            "there is no policy server to fall back on"
        )
    partner = cfg.build_partner(
        context.runtime,
        model=context.model,
        url=server.url if server else "",
        served_name=server.served_name if server else "",
        min_emoji=context.min_emoji,
        max_emoji=context.max_emoji,
        wait_s=context.server_wait_s,
    )
    similarity = cfg.load_similarity(context.runtime)
    background = cfg.background(similarity, [r["target"] for r in records], context.seed)
    rules = ReaderRules(cfg.max_turns, cfg.tau, cfg.reader_view, cfg.contrast)
    builder = ReaderBuilder(context.tokenizer, partner, GuessScorer(similarity, background), rules)
    return GameSetup(
        builder,
        records,
        "none",
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
