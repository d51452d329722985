"""The retrieval game's hooks into the evaluation path (`emoji-rl eval-retrieval`, whose fields are in
games/retrieval/evaluate.py): how it is played (modes `single` and `multi`, the judge, the `teacher`
and `random` systems), what a played game keeps, a system's row and the metrics compared.

A record keeps what each turn sent and what the judge guessed, the final similarity, and whether the
final guess picked out its target among K-1 distractor messages (retrieval@1), drawn once per target,
so every system is ranked among the same ones. A row: mean final similarity with its 95% interval,
success at 0.5 / 0.65 / 0.7 / 0.85, turns, format violations, retrieval@1, emoji per message and the
emoji statistics (distinct, entropy, share of the 10 most used: seed 001's SFT emoji were "generic").
GRPO's held-out evaluation reports the compared metrics of each game too (`held_out_metrics`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING, Any

from emoji_rl.decode.senders import eval_systems
from emoji_rl.emoji.stats import reply_stats
from emoji_rl.errors import UserError
from emoji_rl.game.compare import LEVEL, Metric
from emoji_rl.game.evaluation import EvalSetup, Evaluation, ModelSender, Report, Scripted
from emoji_rl.game.intervals import bootstrap_mean
from emoji_rl.games.retrieval.game import SUCCESS_THRESHOLDS
from emoji_rl.io.jsonl import Record

if TYPE_CHECKING:
    from emoji_rl.game.similarity import Similarity
    from emoji_rl.game.types import Episode, HeldOutMetrics
    from emoji_rl.lm.models import Runtime

DISTRACTORS = 10
"""K of retrieval@1 unless told: the target ranked among K-1 other held-out targets."""


def distractor_sets(targets: Sequence[str], k: int, seed: int) -> list[list[str]]:
    """Per target, the K candidates retrieval@1 ranks: the target first, then K-1 other targets (a
    seeded draw, so every system is ranked among the same ones)."""
    pool = list(dict.fromkeys(targets))
    if len(pool) < k:
        raise UserError(
            f"retrieval@1 among {k} needs at least {k} distinct targets, the data has {len(pool)}"
        )
    rng = random.Random(seed)
    return [[target, *rng.sample([t for t in pool if t != target], k - 1)] for target in targets]


def retrieved(
    similarity: Similarity, candidates: Sequence[Sequence[str]], guesses: Sequence[str]
) -> list[bool]:
    """Per guess, whether its own target (candidates[i][0]) is nearer to it than every distractor;
    a tie is a miss, as in `similarity.retrieval_at_1`. One embedding call for all."""
    pairs = [(c, g) for cands, g in zip(candidates, guesses, strict=True) for c in cands]
    scores = similarity.similarity([c for c, _ in pairs], [g for _, g in pairs])
    hits, start = [], 0
    for cands in candidates:
        row, start = scores[start : start + len(cands)], start + len(cands)
        hits.append(all(row[0] > other for other in row[1:]))
    return hits


def episode_record(episode: Episode, record: Record) -> Record:
    """One message's game: what each turn sent and what the judge guessed, the final similarity."""
    final = episode.turns[-1].result
    turns = [
        {k: v for k, v in turn.result.log.items() if k in ("emoji", "guess", "violation")}
        for turn in episode.turns
    ]
    return {
        "target": record["target"],
        "turns": turns,
        "similarity": final.metrics["similarity"],
        "violation": bool(final.metrics["format_violation"]),
    }


def final_guess(record: Record) -> str:
    return next((t["guess"] for t in reversed(record["turns"]) if "guess" in t), "[unknown]")


def scored_records(
    similarity: Similarity,
    records: Sequence[Record],
    candidates: Sequence[Sequence[str]],
    indices: Sequence[int],
    episodes: Sequence[Episode],
) -> list[Record]:
    """What is kept of each game, records[indices[i]] played as episodes[i], with whether its final
    guess picked out its target among the record's candidates (`distractor_sets`)."""
    kept = [episode_record(e, records[i]) for e, i in zip(episodes, indices, strict=True)]
    hits = retrieved(similarity, [candidates[i] for i in indices], [final_guess(r) for r in kept])
    return [{**record, "retrieved": hit} for record, hit in zip(kept, hits, strict=True)]


def held_out_metrics(similarity: Similarity, seed: int) -> HeldOutMetrics:
    """GRPO's held-out evaluation of the game (`GameSetup.held_out_metrics`), scored by the reward's
    embedder: per game, the metrics this stage compares, retrieval@1 among DISTRACTORS candidates (all
    the distinct held-out targets when there are fewer) named retrieval@1/K as the stage's row names
    it. The distractors are drawn with the run's seed, so every evaluation of a run ranks each target
    among the same ones."""

    def metrics(
        records: Sequence[Record], indices: Sequence[int], episodes: Sequence[Episode]
    ) -> list[dict[str, float]]:
        targets = [r["target"] for r in records]
        k = min(DISTRACTORS, len(set(targets)))
        if k < 2:  # no other target to rank one among (similarity and success are final metrics)
            return [{} for _ in episodes]
        kept = scored_records(similarity, records, distractor_sets(targets, k, seed), indices, episodes)
        names = {"retrieval@1": f"retrieval@1/{k}"}
        return [{names.get(name, name): value for name, value in EVALUATION.values(r).items()} for r in kept]

    return metrics


def sent_texts(records: Sequence[Record]) -> tuple[list[str], list[bool]]:
    """Every turn's message and whether the game took it: a turn it refused (cut off by the token
    budget, or no emoji message) counts for no emoji, whatever its text."""
    turns = [t for r in records for t in r["turns"]]
    return [t.get("emoji", "") for t in turns], ["violation" not in t for t in turns]


def summarize(records: Sequence[Record], cfg: Any) -> Record:
    """A system's row in one mode, from its records."""
    n = len(records)
    similarity = bootstrap_mean([r["similarity"] for r in records], cfg.resamples, cfg.seed, LEVEL)
    texts, stopped = sent_texts(records)
    stats = reply_stats(texts, cfg.min_emoji, cfg.max_emoji, stopped=stopped)
    return {
        "similarity": similarity.mean,
        "similarity_lo": similarity.low,
        "similarity_hi": similarity.high,
        **{f"success@{t}": sum(r["similarity"] >= t for r in records) / n for t in SUCCESS_THRESHOLDS},
        "turns": sum(len(r["turns"]) for r in records) / n,
        "violations": sum(r["violation"] for r in records) / n,
        f"retrieval@1/{cfg.distractors}": sum(r["retrieved"] for r in records) / n,
        **{k: v for k, v in asdict(stats).items() if k not in ("replies", "compliance")},
    }


def success_at(threshold: float) -> Metric:
    return lambda record: float(record["similarity"] >= threshold)


# Compared per message: the similarity, success as 0/1 at two thresholds, and as 0/1 whether the
# guess picked out its target (retrieval@1).
COMPARED: dict[str, Metric] = {
    "similarity": lambda record: record["similarity"],
    "success@0.5": success_at(0.5),
    "success@0.7": success_at(0.7),
    "retrieval@1": lambda record: float(record["retrieved"]),
}


def setup(cfg: Any, records: Sequence[Record], tokenizer: Any, runtime: Runtime) -> EvalSetup:
    from emoji_rl.decode.senders import fixed_answers, teacher_emoji
    from emoji_rl.emoji.sender_prompts import sender_messages
    from emoji_rl.game.guessing import NAMES_CAVEAT
    from emoji_rl.games.retrieval.game import RetrievalBuilder, RetrievalRules
    from emoji_rl.lm import template

    targets = [r["target"] for r in records]
    systems = eval_systems(cfg.systems)
    candidates = distractor_sets(targets, cfg.distractors, cfg.seed)
    fixed = fixed_answers(
        systems, targets, cfg.data, cfg.min_emoji, cfg.max_emoji, cfg.random_length, cfg.seed
    )
    judge = cfg.build_judge(runtime)
    similarity = cfg.load_similarity(runtime)

    def builder(mode: str) -> RetrievalBuilder:
        turns = 1 if mode == "single" else cfg.max_turns
        rules = RetrievalRules(turns, cfg.tau, cfg.min_emoji, cfg.max_emoji)
        return RetrievalBuilder(tokenizer, judge, similarity, rules)

    sender = ModelSender(
        cfg.decoding(
            constraint="grammar" if cfg.protocol == "ours" else "none",
            temperature=cfg.sender_temperature,
            num_beams=cfg.num_beams,
            guidance_scale=cfg.guidance_scale,
        ),
        # classifier-free guidance's unconditional prompt: the sender asked to answer an empty message
        template.chat_ids(tokenizer, sender_messages("")),
    )
    # The teacher's and random answers are one message per target: the multi-turn game is not theirs.
    scripted = {
        name: Scripted(
            [None if a is None else [a] for a in answers], ("single",), "n/a: one fixed message per target"
        )
        for name, answers in fixed.items()
    }
    described = judge.describe()
    retrieval = f"retrieval@1/{cfg.distractors}"
    report = Report(
        header={
            "protocol": cfg.protocol,
            "sender_temperature": cfg.sender_temperature,
            "sender_num_beams": cfg.num_beams,
            "sender_guidance_scale": cfg.guidance_scale,
            "judge": described,
            "data": cfg.data,
            "examples": len(records),
            "distractors": cfg.distractors,
            "thresholds": list(SUCCESS_THRESHOLDS),
            "interval": f"{LEVEL:.0%} percentile bootstrap over messages, {cfg.resamples} resamples; "
            "comparisons paired (the same messages resampled for both systems)",
            "teacher_emoji": teacher_emoji(systems, fixed, cfg.min_emoji, cfg.max_emoji),
            "caveat": NAMES_CAVEAT if cfg.judge_reads_names else None,
        },
        columns=[
            "system",
            "mode",
            "n",
            "similarity",
            *[f"success@{t}" for t in SUCCESS_THRESHOLDS],
            "turns",
            "violations",
            retrieval,
            "emoji_per_message",
            "distinct_emoji",
            "entropy_bits",
            "top10_share",
        ],
        figure=["similarity", "success@0.5", "success@0.7", retrieval, "distinct_emoji"],
        title=f"retrieval game ({cfg.protocol} protocol), judge {described}",
        heading=f"protocol {cfg.protocol}; judge: {described}; {len(records)} held-out targets",
        note=NAMES_CAVEAT if cfg.judge_reads_names else None,
    )
    score = partial(scored_records, similarity, records, candidates)
    return EvalSetup({mode: builder(mode) for mode in cfg.modes}, sender, scripted, score, report)


EVALUATION = Evaluation(
    name="retrieval",
    field="target",
    hint="make it with `emoji-rl rl-prompts` (it writes the held-out split)",
    unit="message",
    setup=setup,
    summarize=summarize,
    compared=COMPARED,
    headline="similarity",
)
