"""The reader's hooks into the evaluation path (`emoji-rl eval-reader`, whose fields are in
games/reader/evaluate.py): one mode, the whole game (`multi`), played as GRPO plays it: the reader
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
from typing import TYPE_CHECKING, Any

from emoji_rl.errors import DataError
from emoji_rl.game.compare import LEVEL, Metric
from emoji_rl.game.evaluation import EvalSetup, Evaluation, ModelSender, Report
from emoji_rl.game.intervals import bootstrap_mean
from emoji_rl.games.reader.game import SUCCESS_THRESHOLDS
from emoji_rl.games.reader.records import reader_record
from emoji_rl.io.jsonl import Record

if TYPE_CHECKING:
    from emoji_rl.game.types import Episode
    from emoji_rl.lm.models import Runtime

MODE = "multi"
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


def summarize(records: Sequence[Record], cfg: Any) -> Record:
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


def played_records(records: Sequence[Record], path: str, min_emoji: int, max_emoji: int) -> list[Record]:
    """The held-out SFT records as the reader plays them, a bad one named by file and line."""
    played = []
    for number, record in enumerate(records, 1):
        try:
            played.append(reader_record(record, min_emoji, max_emoji))
        except ValueError as error:
            raise DataError(path, number, str(error)) from None
    return played


def setup(cfg: Any, records: Sequence[Record], tokenizer: Any, runtime: Runtime) -> EvalSetup:
    from emoji_rl.decode.generate import Decoding
    from emoji_rl.game.similarity import GuessScorer
    from emoji_rl.games.reader.game import ReaderBuilder, ReaderRules

    played = played_records(records, cfg.data, cfg.min_emoji, cfg.max_emoji)
    partner = cfg.build_partner(
        runtime,
        model=cfg.model,
        url=cfg.partner_url or "",
        served_name=cfg.partner_model or "",
        min_emoji=cfg.min_emoji,
        max_emoji=cfg.max_emoji,
    )
    similarity = cfg.load_similarity(runtime)
    background = cfg.background(similarity, [r["target"] for r in played], cfg.seed)
    rules = ReaderRules(cfg.max_turns, cfg.tau, cfg.reader_view, cfg.contrast)
    builder = ReaderBuilder(tokenizer, partner, GuessScorer(similarity, background), rules)
    sender = partner.describe()
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
    return EvalSetup(
        {MODE: lambda record: builder(reader_record(record, cfg.min_emoji, cfg.max_emoji))},
        ModelSender(Decoding("none", cfg.temperature, cfg.max_new_tokens)),
        {},
        lambda indices, episodes: [
            game_record(e, played[i]["target"]) for e, i in zip(episodes, indices, strict=True)
        ],
        report,
    )


EVALUATION = Evaluation(
    name="reader",
    field="target",
    hint="an SFT split of the teacher's answers: make it with `emoji-rl teacher` (data/sft_test.jsonl)",
    unit="message",
    setup=setup,
    summarize=summarize,
    compared=COMPARED,
    headline="similarity",
)
