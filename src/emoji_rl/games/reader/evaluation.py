"""How `emoji-rl eval --game reader` (`eval-reader`) reports the reader's seat: readers side by side on
held-out messages of an SFT split, with the differences between them as paired 95% bootstrap
intervals. One mode, the whole game (`multi`), played as GRPO plays it, on the sender and embedder the
game's setup builds (spec.py): the reader
shown the teacher's emoji for a held-out message, then, after each guess below `tau`, the frozen
sender's emoji, up to `max_turns` guesses; the reader's turns free text, greedy by default. Every
system is a reader (the base, or an adapter switched under it); the sender is the same frozen model
for all of them, so a difference between systems is the readers'.

A record keeps each turn's emoji and guess, the final guess's similarity, the first guess's (the
teacher's emoji alone, before the sender says anything), the reward (similarity less contrast x
background, the background measured on held-out messages) and the game's final metrics. A row: the
three means, similarity with its 95% bootstrap interval over the messages, success at 0.3 / 0.5 / 0.7,
turns, and the shares of games ending on `[unknown]`, with a turn cut off by the token budget, or
with a sender answer that was no emoji message. Compared between systems, message by message: the
final similarity, the first similarity and the reward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from emoji_rl.config import override
from emoji_rl.decode.generate import SamplingConfig
from emoji_rl.decode.senders import parse_systems
from emoji_rl.errors import UserError
from emoji_rl.games.reader.game import SUCCESS_THRESHOLDS
from emoji_rl.io.jsonl import Record
from emoji_rl.play.compare import LEVEL, Metric
from emoji_rl.play.evaluation import EvalConfig, EvalOptions, EvalPlan, Evaluation, ModelSender, Report
from emoji_rl.play.intervals import bootstrap_mean
from emoji_rl.play.similarity import ContrastConfig

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.play.types import Episode, GameSetup

SHARES = ("unknown", "cut_off", "partner_failed")
"""A game's final metrics the row gives as shares of games."""

# Compared per message: what the reader's final guess and its first guess are worth, and the reward.
COMPARED: dict[str, Metric] = {
    "similarity": lambda record: record["similarity"],
    "first_similarity": lambda record: record["first_similarity"],
    "reward": lambda record: record["reward"],
}


def game_record(episode: Episode, target: str) -> Record:
    """One message's game: each turn's emoji and guess, the figures compared, the final metrics."""
    final = episode.turns[-1].result
    metrics = final.metrics
    return {
        "target": target,
        "turns": [{k: turn.result.log[k] for k in ("emoji", "guess")} for turn in episode.turns],
        "similarity": metrics["similarity"],
        "first_similarity": metrics["first_similarity"],
        "reward": final.reward,
        "metrics": metrics,
    }


def summarize(records: Sequence[Record], cfg: EvalConfig) -> Record:
    """A system's row, from its records."""
    n = len(records)
    similarity = bootstrap_mean([r["similarity"] for r in records], cfg.resamples, cfg.seed, LEVEL)
    return {
        "similarity": similarity.mean,
        "similarity_lo": similarity.low,
        "similarity_hi": similarity.high,
        "first_similarity": sum(r["first_similarity"] for r in records) / n,
        "reward": sum(r["reward"] for r in records) / n,
        **{f"success@{t}": sum(r["similarity"] >= t for r in records) / n for t in SUCCESS_THRESHOLDS},
        "turns": sum(r["metrics"]["turns"] for r in records) / n,
        **{key: sum(r["metrics"][key] > 0 for r in records) / n for key in SHARES},
    }


def plan(
    cfg: EvalConfig, game: GameSetup, records: Sequence[Record], tokenizer: PreTrainedTokenizerBase
) -> EvalPlan:
    from emoji_rl.decode.generate import Decoding
    from emoji_rl.games.reader.game import ReaderBuilder

    builder = game.make_env
    assert isinstance(builder, ReaderBuilder), builder
    sender = builder.partner.describe()
    report = Report(
        header={
            "model": cfg.model,
            "data": cfg.data,
            "examples": len(records),
            "sender": sender,
            "reader_view": cfg.reader_view,
            "reader_temperature": cfg.temperature,
            "max_turns": cfg.max_turns,
            "tau": cfg.tau,
            "contrast": cfg.contrast,
            "interval": f"{LEVEL:.0%} percentile bootstrap over messages, {cfg.resamples} resamples; "
            "comparisons paired (the same messages resampled for both systems)",
        },
        columns=[
            "system",
            "n",
            "similarity",
            "first_similarity",
            "reward",
            *[f"success@{t}" for t in SUCCESS_THRESHOLDS],
            "turns",
            *SHARES,
        ],
        figure=["similarity", "first_similarity", "reward", "success@0.5"],
        title=f"the reader's seat, {len(records)} held-out messages, sender {sender}",
        group="system",
        heading=f"reader ({cfg.reader_view} view), sender {sender}; {len(records)} held-out messages",
    )
    return EvalPlan(
        ModelSender(Decoding("none", cfg.temperature, cfg.max_new_tokens)),
        lambda indices, episodes: [
            game_record(e, records[i]["target"]) for e, i in zip(episodes, indices, strict=True)
        ],
        report,
    )


BASE = "base"
# The reader writes one sentence of under 15 words (the judge's prompt); the cpu profile trains at 32.
MAX_NEW_TOKENS = 32


@dataclass
class Options(EvalOptions):
    """Evaluate readers on the reader's seat: base vs adapters, paired intervals of the differences."""

    compare: list[str] = field(
        default_factory=list,
        metadata={
            "help": "pairs A:B to report mean(A - B) with a paired interval; none: each adapter vs base"
        },
    )
    data: str = override(
        EvalConfig,
        "data",
        "data/sft_test.jsonl",
        help="held-out SFT split: `target` and the teacher's emoji as the last assistant turn of `messages`",
    )
    output_dir: str = override(EvalConfig, "output_dir", "reports/reader")
    # As the reader profiles train (configs/*/grpo.reader.yaml): the reward read as it was trained.
    contrast: float = override(
        ContrastConfig,
        "contrast",
        1.0,
        help="times the final guess's mean similarity to contrast_messages held-out messages, subtracted "
        "in the reward (0: the reward is the similarity)",
    )
    temperature: float = override(
        SamplingConfig, "temperature", 0.0, help="the reader's sampling temperature; 0 = greedy"
    )
    max_new_tokens: int = override(
        SamplingConfig, "max_new_tokens", MAX_NEW_TOKENS, help="token budget of one guess"
    )

    result_fields = (
        "model",
        "max_turns",
        "tau",
        "reader_view",
        "temperature",
        "max_new_tokens",
        "min_emoji",
        "max_emoji",
        "partner",
        "partner_model",
        "partner_adapter",
        "partner_url",
        "partner_temperature",
        "partner_max_new_tokens",
        "similarity_model",
        "contrast",
        "contrast_messages",
        "seed",
    )

    def __post_init__(self) -> None:
        names = list(parse_systems(self.systems))
        if not self.compare and BASE in names:
            self.compare = [f"{name}:{BASE}" for name in names if name != BASE]
        super().__post_init__()
        if self.partner == "openai" and (self.partner_url is None or self.partner_model is None):
            raise UserError(
                "partner=openai in an evaluation needs partner_url and partner_model: there is no policy "
                "server to fall back on"
            )


EVALUATION = Evaluation(
    unit="message",
    compared=COMPARED,
    headline="similarity",
    plan=plan,
    summarize=summarize,
    config=Options,
)
