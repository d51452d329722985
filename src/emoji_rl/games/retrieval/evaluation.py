"""How `emoji-rl eval --game retrieval` (`eval-retrieval`) reports the retrieval game: base vs SFT vs RL
(and the teacher's own emoji, and random emoji) on held-out targets, with the differences between
systems as paired 95% bootstrap intervals; its fields beside the game's (`Options`), how a sender
samples (`--protocol`), the `teacher` and `random` systems, what a played game keeps, a system's row
and the metrics compared. The judge, the similarity and the rules are the game's setup's (spec.py),
the same as training's.

Systems: `base` (the base model as sender), NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter),
`teacher=FILE.jsonl` (the teacher's own answer per target, read from SFT split records: `target` and
`messages`, whose last assistant turn is the emoji) and `random` (random alphabet emoji, as many per
message as the teacher's answer for it, else `random_length`). Each system plays every target
single-turn (one emoji message, one guess) and multi-turn (up to `max_turns`, the judge's guess shown
back to the sender); the teacher and random answers are one message, so their multi-turn rows are n/a.

Protocols (`--protocol`):
- `ours` (default): the sender decodes greedily under the emoji grammar, so every reply is an emoji
  message and a system is measured by what it means, not by luck or format; held-out targets.
- `seed`: as seed 001's original evaluated, so a number can sit beside the seed's (held-out success
  rose from 15-20% to 54% after RL there): the sender samples at T 0.7 with no constraint, the parser
  is the filter (a reply that is no emoji message is a format violation and ends the game; with no
  earlier guess its similarity is 0), and success@0.7 is the headline. Unlike the original we keep the
  held-out targets (it evaluated on its training prompts).

    emoji-rl eval --game retrieval --systems base sft=runs/sft/adapter rl=runs/grpo/adapter \
        teacher=data/sft_train.jsonl random --compare rl:sft sft:base rl:teacher
    emoji-rl eval-retrieval --config configs/gpu/eval_retrieval.yaml --protocol seed --modes single

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
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Literal

from emoji_rl.config import override
from emoji_rl.decode.generate import SamplingConfig
from emoji_rl.decode.senders import eval_systems
from emoji_rl.emoji.stats import reply_stats
from emoji_rl.errors import UserError
from emoji_rl.games.retrieval.game import SUCCESS_THRESHOLDS
from emoji_rl.io.jsonl import Record
from emoji_rl.play.compare import LEVEL, Metric
from emoji_rl.play.evaluation import (
    EvalConfig,
    EvalOptions,
    EvalPlan,
    Evaluation,
    ModelSender,
    Report,
    Scripted,
)
from emoji_rl.play.intervals import bootstrap_mean
from emoji_rl.play.judge_config import greedy_judge_temperature

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.play.similarity import Similarity
    from emoji_rl.play.types import Episode, GameSetup, HeldOutMetrics

DISTRACTORS = 10
"""K of retrieval@1 unless told: the target ranked among K-1 other held-out targets."""
Mode = Literal["single", "multi"]
Protocol = Literal["ours", "seed"]
MODES: tuple[Mode, ...] = ("single", "multi")
SEED_TEMPERATURE = 0.7
RANDOM_LENGTH = 3


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


def summarize(records: Sequence[Record], cfg: EvalConfig) -> Record:
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


def plan(
    cfg: EvalConfig, game: GameSetup, records: Sequence[Record], tokenizer: PreTrainedTokenizerBase
) -> EvalPlan:
    from emoji_rl.decode.senders import fixed_answers, teacher_emoji
    from emoji_rl.emoji.sender_prompts import sender_messages
    from emoji_rl.games.retrieval.game import RetrievalBuilder
    from emoji_rl.lm import template
    from emoji_rl.play.guessing import NAMES_CAVEAT

    targets = [r["target"] for r in records]
    systems = eval_systems(cfg.systems)
    candidates = distractor_sets(targets, cfg.distractors, cfg.seed)
    fixed = fixed_answers(
        systems, targets, cfg.data, cfg.min_emoji, cfg.max_emoji, cfg.random_length, cfg.seed
    )
    builder = game.make_env
    assert isinstance(builder, RetrievalBuilder), builder
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
    described = builder.judge.describe()
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
    score = partial(scored_records, builder.similarity, records, candidates)
    return EvalPlan(sender, score, report, scripted, list(cfg.modes))


@dataclass
class Options(EvalOptions):
    """Evaluate senders on the retrieval game, with paired intervals of their differences."""

    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={
            "help": "systems to compare: `base`, NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter), "
            "teacher=FILE.jsonl (SFT split records: the teacher's answers) and `random`",
            "input": True,
        },
    )
    data: str = override(
        EvalConfig, "data", "data/rl_eval.jsonl", help="held-out targets, JSONL with `target`"
    )
    output_dir: str = override(EvalConfig, "output_dir", "reports/retrieval")
    judge_temperature: float = greedy_judge_temperature()
    modes: list[str] = field(
        default_factory=lambda: list(MODES), metadata={"help": "which games: single, multi or both"}
    )
    protocol: Protocol = field(
        default="ours",
        metadata={
            "help": "ours: greedy, emoji-constrained sender; seed: as seed 001 evaluated (sampled at "
            "T 0.7, unconstrained, the parser as filter)"
        },
    )
    distractors: int = field(
        default=DISTRACTORS, metadata={"help": "K: candidates (target + K-1 others) for retrieval@1"}
    )
    temperature: float | None = override(
        SamplingConfig,
        "temperature",
        None,
        help="sender sampling temperature; none: the protocol's (ours 0 = greedy, seed 0.7)",
    )
    num_beams: int = field(
        default=1,
        metadata={
            "help": "with a greedy sender: 1 = the likeliest token at each step; > 1 = beam search for the "
            "likeliest whole message (an emoji is several byte tokens: docs/DESIGN.md §2)"
        },
    )
    guidance_scale: float = field(
        default=1.0,
        metadata={
            "help": "with a greedy sender: classifier-free guidance, each token scored u + g (c - u) from its "
            "log-probs given the message (c) and given an empty one (u); > 1 discounts emoji the sender "
            "would send for any message (docs/DESIGN.md §2)"
        },
    )
    random_length: int = field(
        default=RANDOM_LENGTH,
        metadata={"help": "emoji per `random` answer where no teacher answer gives the length"},
    )

    result_fields = (
        "model",
        "protocol",
        "sender_temperature",
        "num_beams",
        "guidance_scale",
        "max_new_tokens",
        "min_emoji",
        "max_emoji",
        "max_turns",
        "tau",
        "distractors",
        "similarity_model",
        "seed",
        "judge",
        "judge_view",
        "judge_model",
        "judge_temperature",
    )

    def system_names(self) -> list[str]:
        return list(eval_systems(self.systems))

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.distractors < 2:
            raise ValueError(
                f"distractors={self.distractors} must be >= 2: retrieval ranks the target among them"
            )
        if not self.modes or set(self.modes) - set(MODES):
            raise ValueError(f"modes={self.modes}: choose from {', '.join(MODES)}")
        if not self.min_emoji <= self.random_length <= self.max_emoji:
            raise ValueError(
                f"random_length={self.random_length} must lie within {self.min_emoji}..{self.max_emoji}"
            )
        if self.num_beams < 1:
            raise ValueError(f"num_beams={self.num_beams} must be >= 1")
        searched = self.num_beams > 1 or self.guidance_scale != 1.0
        if searched and (self.protocol != "ours" or self.sender_temperature > 0):
            raise ValueError(
                f"num_beams={self.num_beams}, guidance_scale={self.guidance_scale} need the greedy, "
                f"emoji-constrained sender of protocol ours (got protocol {self.protocol}, temperature "
                f"{self.sender_temperature})"
            )

    @property
    def sender_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return SEED_TEMPERATURE if self.protocol == "seed" else 0.0


EVALUATION = Evaluation(
    unit="message",
    compared=COMPARED,
    headline="similarity",
    plan=plan,
    summarize=summarize,
    config=Options,
)
