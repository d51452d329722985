"""`emoji-rl eval-retrieval`: the retrieval game on held-out messages, base vs SFT vs RL side by side.

Each system plays every held-out target twice: single-turn (one emoji message, one guess) and
multi-turn (up to `max_turns`, with the judge's guess shown back to the sender). Reported per system
and mode: mean final similarity, success at 0.65 / 0.7 / 0.85, turns used, format violations,
retrieval@1 (does the final guess pick out its target among K-1 distractor messages?), and emoji
statistics (distinct, entropy, share of the 10 most used: seed 001's SFT emoji were "generic").
Writes a table, `retrieval.json` and `retrieval.png` to `output_dir`.

    emoji-rl eval-retrieval --systems base sft=runs/sft/adapter rl=runs/grpo/adapter
    emoji-rl eval-retrieval --config configs/gpu/eval_retrieval.yaml
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from emoji_rl import models
from emoji_rl.data.jsonl import read_jsonl, write_json
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI
from emoji_rl.errors import UserError
from emoji_rl.eval.report import bar_figure, format_table
from emoji_rl.eval.stats import reply_stats
from emoji_rl.generate import MAX_NEW_TOKENS
from emoji_rl.rl.games.retrieval import SUCCESS_THRESHOLDS, RetrievalBuilder, RetrievalRules
from emoji_rl.rl.judge_config import JudgeConfig
from emoji_rl.rl.rollout.hf import HFSampler
from emoji_rl.rl.rollout.play import play
from emoji_rl.rl.types import Episode

if TYPE_CHECKING:
    from peft import PeftModel

    from emoji_rl.rl.reward import Similarity


@dataclass
class Config(JudgeConfig):
    """Evaluate senders on the retrieval game: base vs SFT vs RL."""

    model: str = field(default=models.SMOLLM2, metadata={"help": "base model spec of every system"})
    # Greedy: every system's emoji read the same way, so a difference between systems is the senders'.
    judge_temperature: float = field(
        default=0.0, metadata={"help": "the judge's sampling temperature; 0 = greedy, deterministic"}
    )
    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={"help": "systems to compare: `base`, or NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter)"},
    )
    data: str = field(
        default="data/rl_eval.jsonl", metadata={"help": "held-out targets, JSONL with `target`"}
    )
    max_examples: int = field(default=0, metadata={"help": "evaluate at most this many targets (0 = all)"})
    output_dir: str = field(default="reports/retrieval", metadata={"help": "where the JSON and PNG go"})
    max_turns: int = field(default=5, metadata={"help": "turns of the multi-turn game"})
    tau: float = field(default=0.85, metadata={"help": "similarity that ends a multi-turn game early"})
    distractors: int = field(
        default=10, metadata={"help": "K: candidates (target + K-1 others) for retrieval@1"}
    )
    temperature: float = field(default=0.0, metadata={"help": "sender sampling temperature; 0 = greedy"})
    max_new_tokens: int = field(default=MAX_NEW_TOKENS, metadata={"help": "token budget of one sender turn"})
    min_emoji: int = field(default=MIN_EMOJI, metadata={"help": "fewest emoji in a valid turn"})
    max_emoji: int = field(default=MAX_EMOJI, metadata={"help": "most emoji in a valid turn"})
    similarity_model: str = field(default=models.MINILM, metadata={"help": "sentence embedder"})
    batch_size: int = field(default=32, metadata={"help": "episodes per generate call"})
    seed: int = field(default=0, metadata={"help": "seed for sampling and distractor choice"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.distractors < 2:
            raise ValueError(
                f"distractors={self.distractors} must be >= 2: retrieval ranks the target among them"
            )
        parse_systems(self.systems)


def parse_systems(specs: Sequence[str]) -> dict[str, str | None]:
    """`base` -> no adapter; `NAME=DIR` -> that adapter. Names must be unique."""
    systems: dict[str, str | None] = {}
    for spec in specs:
        name, _, adapter = spec.partition("=")
        if not name or (spec != "base" and not adapter):
            raise ValueError(f"system {spec!r}: use `base` or NAME=ADAPTER_DIR")
        if name in systems:
            raise ValueError(f"system name {name!r} appears twice in systems")
        systems[name] = adapter or None
    return systems


def load_systems(base: torch.nn.Module, systems: dict[str, str | None]) -> PeftModel | torch.nn.Module:
    """All adapters on one copy of the base weights, one PEFT adapter per system."""
    from peft import PeftModel

    adapters = {name: path for name, path in systems.items() if path}
    for name, path in adapters.items():
        if not (Path(path) / "adapter_config.json").is_file():
            raise UserError(
                f"system {name}: {path} has no adapter_config.json (is it a PEFT adapter directory?)"
            )
    model: torch.nn.Module = base
    for name, path in adapters.items():
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=name)
        else:
            model = PeftModel.from_pretrained(base, path, adapter_name=name)
    model.eval()
    return model


@contextlib.contextmanager
def active_system(model: torch.nn.Module, name: str, adapter: str | None) -> Iterator[None]:
    from peft import PeftModel

    if adapter is None and isinstance(model, PeftModel):
        with model.disable_adapter():
            yield
        return
    if adapter is not None:
        model.set_adapter(name)
    yield


def retrieval_at_k(
    similarity: Similarity, targets: Sequence[str], guesses: Sequence[str], k: int, seed: int
) -> float:
    """Share of guesses closest to their own target among it and k-1 other targets (seeded draw)."""
    pool = list(dict.fromkeys(targets))
    if len(pool) < k:
        raise UserError(
            f"retrieval@1 among {k} needs at least {k} distinct targets, the data has {len(pool)}"
        )
    rng = random.Random(seed)
    hits = 0
    for target, guess in zip(targets, guesses, strict=True):
        candidates = [target, *rng.sample([t for t in pool if t != target], k - 1)]
        scores = similarity.similarity(candidates, [guess] * k)
        hits += int(max(range(k), key=scores.__getitem__) == 0)
    return hits / len(targets)


def summarize(
    episodes: Sequence[Episode], targets: Sequence[str], similarity: Similarity, cfg: Config
) -> dict[str, float]:
    finals = [e.turns[-1].result for e in episodes]
    guesses = [
        next((t.result.log["guess"] for t in reversed(e.turns) if "guess" in t.result.log), "")
        for e in episodes
    ]
    emoji_texts = [t.result.log.get("emoji", "") for e in episodes for t in e.turns]
    stats = reply_stats(emoji_texts, cfg.min_emoji, cfg.max_emoji)
    n = len(episodes)
    row = {
        "similarity": sum(f.metrics["similarity"] for f in finals) / n,
        **{f"success@{t}": sum(f.metrics[f"success@{t}"] for f in finals) / n for t in SUCCESS_THRESHOLDS},
        "turns": sum(len(e.turns) for e in episodes) / n,
        "violations": sum(f.metrics["format_violation"] for f in finals) / n,
        f"retrieval@1/{cfg.distractors}": retrieval_at_k(
            similarity, targets, [g or "[unknown]" for g in guesses], cfg.distractors, cfg.seed
        ),
    }
    return {**row, **{k: v for k, v in asdict(stats).items() if k not in {"replies", "compliance"}}}


def main(cfg: Config) -> None:
    from emoji_rl.rl.judge import NAMES_CAVEAT
    from emoji_rl.rl.reward import Similarity

    torch.manual_seed(cfg.seed)
    records = read_jsonl(cfg.data, hint="make it with `emoji-rl rl-prompts` (it writes the held-out split)")
    if cfg.max_examples:
        records = records[: cfg.max_examples]
    targets = [r["target"] for r in records]
    runtime = models.pick_runtime()
    tokenizer = models.load_tokenizer(cfg.model)
    systems = parse_systems(cfg.systems)
    model = load_systems(models.load_causal_lm(cfg.model, runtime), systems)
    judge = cfg.build_judge(runtime)
    similarity = Similarity(models.load_embedder(cfg.similarity_model, device=runtime.device))
    sampler = HFSampler(
        model,
        tokenizer,
        "grammar",
        cfg.temperature,
        cfg.max_new_tokens,
        cfg.batch_size,
        cfg.min_emoji,
        cfg.max_emoji,
    )
    rows = []
    for name, adapter in systems.items():
        for mode, turns in (("single", 1), ("multi", cfg.max_turns)):
            rules = RetrievalRules(
                max_turns=turns, tau=cfg.tau, min_emoji=cfg.min_emoji, max_emoji=cfg.max_emoji
            )
            builder = RetrievalBuilder(tokenizer, judge, similarity, rules)
            with active_system(model, name, adapter):
                episodes = asyncio.run(play([builder(r) for r in records], sampler))
            rows.append({"system": name, "mode": mode, **summarize(episodes, targets, similarity, cfg)})
            print(f"eval-retrieval: {name} {mode}-turn: similarity {rows[-1]['similarity']:.3f}", flush=True)
    out = Path(cfg.output_dir)
    columns = [
        "system",
        "mode",
        "similarity",
        *[f"success@{t}" for t in SUCCESS_THRESHOLDS],
        "turns",
        "violations",
        f"retrieval@1/{cfg.distractors}",
        "distinct_emoji",
        "entropy_bits",
        "top10_share",
    ]
    table = format_table(rows, columns)
    write_json(
        out / "retrieval.json",
        {
            "judge": judge.describe(),
            "data": cfg.data,
            "examples": len(records),
            "rows": rows,
            "caveat": NAMES_CAVEAT if cfg.judge_reads_names else None,
        },
    )
    figure = bar_figure(
        rows,
        ["similarity", "success@0.7", f"retrieval@1/{cfg.distractors}", "distinct_emoji"],
        group="mode",
        series="system",
        title=f"retrieval game, judge {judge.describe()}",
        path=out / "retrieval.png",
    )
    print(f"\njudge: {judge.describe()}; {len(records)} held-out targets\n{table}\n")
    if cfg.judge_reads_names:
        print(NAMES_CAVEAT)
    print(f"report: {out / 'retrieval.json'}\nplot:   {figure}")
