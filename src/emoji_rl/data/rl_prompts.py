"""`emoji-rl rl-prompts`: the target messages GRPO trains on, kept when the SFT sender already gets
them across in one turn (docs/DESIGN.md §5; seed 001 kept round trips at similarity >= 0.4).

Candidates are the prompts (already deduplicated by `emoji-rl prompts`) minus the SFT test split (by
id and by normalized text, so the SFT evaluation stays unseen), within `min_words`..`max_words`,
a seeded sample of at most `max_prompts`. Each is scored by one round trip: the sender (base model +
SFT adapter) answers `prompts.sender_messages(target)` under the emoji grammar, the judge makes one
guess from those emoji, and the score is the MiniLM similarity of guess and target. A target that
no first message gets near gives GRPO groups with little reward spread, so those are dropped.

The kept prompts are split, seeded, into `rl_train.jsonl` and `rl_eval.jsonl`. Training reads only
`rl_train.jsonl`; `rl_eval.jsonl` is for `eval-retrieval`. Both come from the filtered set, so
evaluation numbers are on messages the SFT sender could already convey. One JSON object per line:
    {"id": "corpus-…", "target": "Let's grab pizza tonight", "category": "statement",
     "source": "corpus", "emoji": "🍕 🌙", "guess": "pizza, crescent moon", "similarity": 0.5731}
(`emoji`: the sender's answer, single spaces; `guess`: the judge's cleaned guess.) Beside them,
`rl_prompts_stats.json`: counts at each filter, the similarity mean and a histogram.

    cpu: emoji-rl rl-prompts --adapter runs/sft/adapter                   # SmolLM2 judge on glosses
         emoji-rl rl-prompts --adapter runs/sft/adapter --judge lexicon   # no LLM judge: seconds
    gpu: emoji-rl rl-prompts --model Qwen/Qwen3.5-4B --adapter runs/sft/adapter --batch_size 64
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.config import override
from emoji_rl.data.dedup import normalize
from emoji_rl.data.prompts import Prompt, held_out, read_prompts
from emoji_rl.decode.generate import SamplingConfig
from emoji_rl.emoji.alphabet import SEPARATOR, parse_message
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import Record, read_jsonl, write_json, write_jsonl
from emoji_rl.lm import models
from emoji_rl.play.guessing import JudgeInput
from emoji_rl.play.judge_config import JudgeConfig
from emoji_rl.play.similarity import SimilarityConfig

if TYPE_CHECKING:
    from emoji_rl.decode.generate import Reply
    from emoji_rl.play.judge import Judge
    from emoji_rl.play.similarity import Similarity

log = logging.getLogger(__name__)

TRAIN_FILE = "rl_train.jsonl"
EVAL_FILE = "rl_eval.jsonl"
STATS_FILE = "rl_prompts_stats.json"


@dataclass
class Config(JudgeConfig, SimilarityConfig, SamplingConfig, models.ModelConfig):
    """Keep the prompts whose one-turn round trip (SFT sender -> judge) is similar enough; split them."""

    # --- core
    prompts: str = field(
        default="data/prompts.jsonl", metadata={"help": "input, from `emoji-rl prompts`", "input": True}
    )
    sft_test: str = field(
        default="data/sft_test.jsonl",
        metadata={"help": "the SFT test split, excluded (from `emoji-rl teacher`)", "input": True},
    )
    output_dir: str = field(
        default="data",
        metadata={"help": "directory of rl_train.jsonl, rl_eval.jsonl, stats", "aliases": ("out_dir",)},
    )
    adapter: str | None = field(
        default="runs/sft/adapter",
        metadata={
            "help": "the sender's SFT LoRA adapter (`emoji-rl sft` output); none: the base model",
            "input": True,
        },
    )
    min_similarity: float = field(
        default=0.4,
        metadata={"help": "round-trip similarity a prompt needs to be kept, in [-1, 1] (seed 001: 0.4)"},
    )
    eval_fraction: float = field(
        default=0.1, metadata={"help": "share of kept prompts held out in rl_eval, (0, 1)"}
    )
    min_words: int = field(default=6, metadata={"help": "shortest target, in words"})
    max_words: int = field(
        default=20, metadata={"help": "longest target, in words: a turn of 2-8 emoji says little more"}
    )
    max_prompts: int | None = field(
        default=None, metadata={"help": "score at most this many candidates (a seeded sample); none: all"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the sample, the sender's sampling and the split"})
    # --- the sender's sampling (and the similarity_model and judge_* fields)
    temperature: float = override(
        SamplingConfig,
        "temperature",
        0.0,
        help="sender temperature; 0: greedy, the sender's most likely message",
    )
    max_new_tokens: int = override(
        SamplingConfig, "max_new_tokens", 48, help="token budget of the sender's turn, as in GRPO"
    )
    batch_size: int = field(default=16, metadata={"help": "chats per generate call, sender and judge"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.eval_fraction < 1:
            raise ValueError(f"eval_fraction={self.eval_fraction} must be in (0, 1)")
        if not -1 <= self.min_similarity <= 1:
            raise ValueError(f"min_similarity={self.min_similarity} must be in [-1, 1] (a cosine similarity)")
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(f"min_words={self.min_words}, max_words={self.max_words}: need 1 <= min <= max")
        if self.max_prompts is not None and self.max_prompts < 1:
            raise ValueError(f"max_prompts={self.max_prompts} must be >= 1, or none")


@dataclass(frozen=True)
class RoundTrip:
    emoji: tuple[str, ...]
    """The sender's emoji; empty when its reply was not a valid message (cut off, or not emoji)."""
    guess: str
    similarity: float
    """MiniLM cosine of guess and target; -1.0 for an invalid reply, so that it is never kept."""


def candidates(
    prompts: list[Prompt], sft_test: list[Record], cfg: Config
) -> tuple[list[Prompt], Counter[str]]:
    """The prompts that may become RL targets, and how many were dropped for each reason."""
    test_ids = {r["id"] for r in sft_test if "id" in r}
    test_texts = {normalize(r["target"]) for r in sft_test if isinstance(r.get("target"), str)}
    dropped: Counter[str] = Counter()
    kept = []
    for p in prompts:
        if p.id in test_ids or normalize(p.text) in test_texts:
            dropped["in the SFT test split"] += 1
        elif not cfg.min_words <= len(p.text.split()) <= cfg.max_words:
            dropped["out of length bounds"] += 1
        else:
            kept.append(p)
    if cfg.max_prompts is not None and len(kept) > cfg.max_prompts:
        sample = held_out([p.id for p in kept], cfg.max_prompts / len(kept), cfg.seed)
        dropped["beyond max_prompts"] += len(kept) - len(sample)
        kept = [p for p in kept if p.id in sample]
    return kept, dropped


def round_trips(
    targets: list[str],
    replies: list[Reply],
    judge: Judge,
    similarity: Similarity,
    min_emoji: int,
    max_emoji: int,
) -> list[RoundTrip]:
    """Judge every valid reply in one batched call and score its guess against its target."""
    parsed = [parse_message(r.text.strip(), min_emoji, max_emoji) for r in replies]
    valid = [i for i, (p, r) in enumerate(zip(parsed, replies, strict=True)) if p.ok and r.stopped]
    guesses = asyncio.run(judge.guess([JudgeInput(turns=(parsed[i].emoji,)) for i in valid]))
    sims = similarity.similarity([targets[i] for i in valid], [g.text for g in guesses])
    scored = {i: RoundTrip(parsed[i].emoji, g.text, s) for i, g, s in zip(valid, guesses, sims, strict=True)}
    return [scored.get(i, RoundTrip((), "", -1.0)) for i in range(len(replies))]


def _histogram(values: list[float]) -> dict[str, int]:
    """Counts per 0.1-wide bin, labelled by its lower edge ("0.4" holds [0.4, 0.5))."""
    bins = Counter(min(int(max(v, 0.0) * 10), 9) / 10 for v in values)
    return {f"{b:.1f}": bins[b] for b in sorted(bins)}


def write_outputs(
    cfg: Config, chosen: list[Prompt], trips: list[RoundTrip], dropped: Counter[str], describe: dict[str, str]
) -> Record:
    """Keep the prompts at or above the threshold, split them, write both splits and the stats."""
    records = [
        {
            "id": p.id,
            "target": p.text,
            "category": p.category,
            "source": p.source,
            "emoji": SEPARATOR.join(t.emoji),
            "guess": t.guess,
            "similarity": round(t.similarity, 4),
        }
        for p, t in zip(chosen, trips, strict=True)
        if t.emoji and t.similarity >= cfg.min_similarity
    ]
    if not records:
        invalid = sum(not t.emoji for t in trips)
        raise UserError(
            f"no prompt reached similarity {cfg.min_similarity} in {len(chosen)} round trips ({invalid} sender "
            f"replies were no valid message: cut off at max_new_tokens={cfg.max_new_tokens}, or not emoji); "
            "is --adapter an SFT sender? Lower --min_similarity to keep more"
        )
    eval_ids = held_out([r["id"] for r in records], cfg.eval_fraction, cfg.seed)
    out = Path(cfg.output_dir)
    n_train = write_jsonl(out / TRAIN_FILE, (r for r in records if r["id"] not in eval_ids))
    n_eval = write_jsonl(out / EVAL_FILE, (r for r in records if r["id"] in eval_ids))
    scored = [t.similarity for t in trips if t.emoji]
    stats = {
        **describe,
        "dropped_before_scoring": dict(dropped),
        "scored": len(trips),
        "invalid_replies": len(trips) - len(scored),
        "below_threshold": len(scored) - len(records),
        "kept": len(records),
        "train": n_train,
        "eval": n_eval,
        "similarity_mean": round(sum(scored) / len(scored), 4) if scored else None,
        "similarity_histogram": _histogram(scored),
    }
    write_json(out / STATS_FILE, stats)
    return stats


def main(cfg: Config) -> None:
    from emoji_rl.decode.generate import generate_replies
    from emoji_rl.emoji.sender_prompts import sender_messages

    prompts = read_prompts(cfg.prompts)
    sft_test = read_jsonl(
        cfg.sft_test, hint="make it with `emoji-rl teacher`: RL prompts leave the SFT test split out"
    )
    if cfg.adapter is not None and not (Path(cfg.adapter) / "adapter_config.json").is_file():
        raise UserError(
            f"adapter={cfg.adapter} is not a PEFT adapter directory: train one with `emoji-rl sft`, or pass "
            "--adapter none to score with the base model"
        )
    chosen, dropped = candidates(prompts, sft_test, cfg)
    if not chosen:
        raise UserError(f"no candidate prompts left ({dict(dropped)}); widen --min_words/--max_words")
    log.info("%d candidates; dropped before scoring: %s", len(chosen), dict(dropped) or "none")
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    sender = models.load_causal_lm(cfg.model, runtime, cfg.adapter)
    replies = generate_replies(
        sender,
        tokenizer,
        [sender_messages(p.text) for p in chosen],
        cfg.decoding(batch_size=cfg.batch_size),
        seed=cfg.seed,
        progress=True,
    )
    del sender  # the judge may be another copy of a model: hold one at a time
    judge = cfg.build_judge(runtime, cfg.batch_size)
    similarity = cfg.load_similarity(runtime)
    trips = round_trips([p.text for p in chosen], replies, judge, similarity, cfg.min_emoji, cfg.max_emoji)
    describe = {"sender": f"{cfg.model} + {cfg.adapter or 'no adapter'}", "judge": judge.describe()}
    stats = write_outputs(cfg, chosen, trips, dropped, describe)
    print(
        f"kept {stats['kept']}/{stats['scored']} prompts at similarity >= {cfg.min_similarity} "
        f"(mean {stats['similarity_mean']}, {stats['invalid_replies']} invalid replies): "
        f"{stats['train']} in {Path(cfg.output_dir) / TRAIN_FILE}, {stats['eval']} in {Path(cfg.output_dir) / EVAL_FILE}"
    )
