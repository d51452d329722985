"""`emoji-rl eval-sft`: the base model and the SFT adapter side by side on the SFT test split.

For each decoding (unconstrained, emoji grammar, static mask) it generates one reply per test prompt
(greedy unless `--temperature` is set) from the base model (the adapter disabled) and from the SFT
model, with the same prompts and seed, and reports format compliance
(`parse_message(reply).ok`), then over the compliant replies: emoji per message, distinct emoji,
entropy and the share of the 10 most used emoji (seed 001: SFT emoji were "generic"), and, with
`--judge`, the similarity of a single-turn judge guess to the target. The test answers themselves
are a third row, `reference`. Output: a printed table, eval_sft.json and eval_sft.png.

    emoji-rl eval-sft --adapter runs/sft/adapter                        # cpu: embedded SmolLM2
    emoji-rl eval-sft --adapter runs/sft/adapter --judge lexicon --limit 200
    emoji-rl eval-sft --adapter runs/sft-gpu/adapter --judge hf --judge_model Qwen/Qwen3-4B
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

from emoji_rl.config import to_dict
from emoji_rl.decode.generate import MAX_NEW_TOKENS, Constraint, Decoding, generate_replies
from emoji_rl.emoji.stats import compliant_emoji, reply_stats
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import write_json
from emoji_rl.io.report import bar_figure, format_table
from emoji_rl.lm import models
from emoji_rl.play.guessing import NAMES_CAVEAT, JudgeInput
from emoji_rl.play.judge import Judge, JudgeKind
from emoji_rl.play.judge_config import JudgeConfig
from emoji_rl.sft.data import ChatRecord, load_chat_records

if TYPE_CHECKING:
    from emoji_rl.play.similarity import Similarity

logger = logging.getLogger(__name__)

DECODINGS: tuple[Constraint, ...] = ("none", "grammar", "static")
COLUMNS = [
    "system",
    "decoding",
    "replies",
    "compliance",
    "emoji_per_message",
    "distinct_emoji",
    "entropy_bits",
    "top10_share",
    "judge_similarity",
]
FIGURE_METRICS = ["compliance", "distinct_emoji", "entropy_bits", "top10_share", "judge_similarity"]
SAMPLES_KEPT = 20


@dataclass
class Config(JudgeConfig):
    """Base vs SFT on the SFT test split: compliance and emoji statistics, table + JSON + PNG."""

    # --- core ---
    adapter: str | None = field(
        default=None, metadata={"help": "the SFT adapter directory (required)", "input": True}
    )
    model: str | None = field(
        default=None,
        metadata={"help": "base model spec; none: the adapter's base_model_name_or_path"},
    )
    data: str = field(
        default="data/sft_test.jsonl", metadata={"help": "held-out SFT chats, JSONL", "input": True}
    )
    limit: int | None = field(default=None, metadata={"help": "evaluate the first N chats only; none: all"})
    decodings: list[str] = field(
        default_factory=lambda: ["none", "grammar"],
        metadata={"help": f"decodings to compare, from {', '.join(DECODINGS)} (none = unconstrained)"},
    )
    # The one stage whose judge is off by default: compliance and emoji statistics need none.
    judge: JudgeKind | None = field(
        default=None,
        metadata={"help": "single-turn judge for guess similarity (hf, openai or lexicon); none: skip it"},
    )
    output_dir: str | None = field(
        default=None, metadata={"help": "where eval_sft.json and .png go; none: <adapter>/../eval-sft"}
    )

    # --- advanced ---
    temperature: float = field(
        default=0.0,
        metadata={
            "help": "0: greedy, what the model has learned, reproducible; 1.0: what RL samples from, where "
            "unconstrained byte-level sampling also shows how often fragments make non-emoji characters"
        },
    )
    max_new_tokens: int = field(default=MAX_NEW_TOKENS, metadata={"help": "token budget per reply"})
    batch_size: int = field(default=16, metadata={"help": "prompts per generate call"})
    seed: int = field(default=0, metadata={"help": "sampling seed; every system and decoding uses it"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.adapter:
            raise ValueError("--adapter is required: the SFT adapter directory (e.g. runs/sft/adapter)")
        unknown = sorted(set(self.decodings) - set(DECODINGS))
        if unknown or not self.decodings:
            raise ValueError(f"decodings {unknown or '[]'} invalid: choose from {', '.join(DECODINGS)}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit={self.limit} must be >= 1 (or none for all chats)")


def base_model_of(adapter: Path) -> str:
    """The base model an adapter was trained on, from its adapter_config.json."""
    config = adapter / "adapter_config.json"
    if not config.is_file():
        raise UserError(f"{adapter} has no adapter_config.json: pass the adapter/ directory of an SFT run")
    base = json.loads(config.read_text()).get("base_model_name_or_path")
    if not base:
        raise UserError(f"{config} names no base_model_name_or_path: pass --model")
    return base


def judge_similarity(
    judge: Judge, similarity: Similarity, targets: list[str], messages: list[tuple[str, ...] | None]
) -> float | None:
    """Mean similarity of the judge's first guess to the target, over compliant replies (None if none).

    `messages` holds each reply's emoji, None where the reply was not compliant (`compliant_emoji`)."""
    pairs = [(t, m) for t, m in zip(targets, messages, strict=True) if m is not None]
    if not pairs:
        return None
    guesses = asyncio.run(judge.guess([JudgeInput(turns=(m,)) for _, m in pairs]))
    scores = similarity.similarity([t for t, _ in pairs], [g.text for g in guesses])
    return sum(scores) / len(scores)


def targets_of(records: list[ChatRecord], path: str) -> list[str]:
    missing = sum(r.target is None for r in records)
    if missing:
        raise UserError(
            f"{path}: {missing} record(s) have no `target` key and no sender prompt to read it from; "
            "judge similarity needs the target message"
        )
    return [r.target for r in records if r.target is not None]


def main(cfg: Config) -> None:
    assert cfg.adapter is not None  # __post_init__ requires it
    adapter = Path(cfg.adapter)
    output_dir = Path(cfg.output_dir) if cfg.output_dir else adapter.parent / "eval-sft"
    model_spec = cfg.model or base_model_of(adapter)

    # --- data and models
    records = load_chat_records(cfg.data)[: cfg.limit]
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(model_spec)
    model = models.load_causal_lm(model_spec, runtime, adapter=adapter)
    logger.info("eval-sft: %d chats from %s; %s; %s", len(records), cfg.data, model_spec, runtime.describe())
    judged: tuple[Judge, Similarity, list[str]] | None = None
    if cfg.judge is not None:
        from emoji_rl.play.similarity import load_similarity  # imports torch: only when a judge is asked for

        targets = targets_of(records, cfg.data)
        judge = cfg.build_judge(runtime, cfg.batch_size)
        judged = (judge, load_similarity(runtime=runtime), targets)

    # --- sample: the same prompts, seed and decoding for both systems; base = the adapter disabled
    prompts = [r.prompt for r in records]
    replies: dict[str, list[str]] = {}
    stopped: dict[str, list[bool]] = {}
    for decoding in cfg.decodings:
        for system in ("base", "sft"):
            with model.disable_adapter() if system == "base" else contextlib.nullcontext():
                out = generate_replies(
                    model,
                    tokenizer,
                    prompts,
                    Decoding(
                        cast(Constraint, decoding),  # checked against DECODINGS in Config
                        cfg.temperature,
                        cfg.max_new_tokens,
                        cfg.batch_size,
                    ),
                    seed=cfg.seed,
                )
            replies[f"{system}/{decoding}"] = [r.text for r in out]
            stopped[f"{system}/{decoding}"] = [r.stopped for r in out]
    replies["reference"] = [r.answer for r in records]

    # --- score and report
    rows = []
    for key, texts in replies.items():
        system, _, decoding = key.partition("/")
        stats = reply_stats(texts, stopped=stopped.get(key))
        messages = compliant_emoji(texts, stopped=stopped.get(key))
        rows.append(
            {
                "system": system,
                "decoding": decoding or "data",
                **dataclasses.asdict(stats),
                "judge_similarity": judge_similarity(*judged, messages) if judged else None,
            }
        )
    samples = [
        {"target": r.target, **{key: texts[i] for key, texts in replies.items()}}
        for i, r in enumerate(records[:SAMPLES_KEPT])
    ]
    print(format_table(rows, COLUMNS))
    if cfg.judge is not None and cfg.judge_reads_names:
        print(NAMES_CAVEAT)
    write_json(
        output_dir / "eval_sft.json",
        {
            "config": to_dict(cfg),
            "model": model_spec,
            "chats": len(records),
            "results": rows,
            "samples": samples,
        },
    )
    metrics = [m for m in FIGURE_METRICS if any(row[m] is not None for row in rows)]
    figure = bar_figure(
        rows,
        metrics,
        group="decoding",
        series="system",
        title=f"eval-sft: {adapter}",
        path=output_dir / "eval_sft.png",
    )
    sft_none = next((r for r in rows if r["system"] == "sft" and r["decoding"] == "none"), None)
    base_none = next((r for r in rows if r["system"] == "base" and r["decoding"] == "none"), None)
    summary = (
        f"unconstrained compliance base {base_none['compliance']:.0%} -> sft {sft_none['compliance']:.0%}; "
        if sft_none and base_none
        else ""
    )
    logger.info("eval-sft: %s%s and %s written", summary, output_dir / "eval_sft.json", figure)
