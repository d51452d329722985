"""`emoji-rl eval-retrieval`: the retrieval game on held-out messages, systems side by side, with the
differences between them as paired 95% bootstrap intervals.

Systems: `base` (the base model as sender), NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter),
`teacher=FILE.jsonl` (the teacher's own answer per target, read from SFT split records: `target` and
`messages`, whose last assistant turn is the emoji) and `random` (random alphabet emoji, as many per
message as the teacher's answer for it, else `random_length`). Each system plays every target
single-turn (one emoji message, one guess) and multi-turn (up to `max_turns`, the judge's guess shown
back to the sender); the teacher and random answers are one message, so their multi-turn rows are
n/a. Reported per system and mode: mean final similarity, success at 0.5 / 0.65 / 0.7 / 0.85, turns,
format violations, retrieval@1 (does the final guess pick out its target among K-1 distractor
messages?), emoji per message and emoji statistics (distinct, entropy, share of the 10 most used:
seed 001's SFT emoji were "generic").

Differences can be believed because every system sees the same messages, the same distractors and
the same judge (greedy by default, so one emoji message always gets one guess): `--compare A:B`
(default: each adjacent pair in `systems` order) gives mean(A - B) over the messages both played
(`--reference_examples N` keeps base, teacher and random to the first N, so adapters can play more),
similarity, success@0.5 / 0.7 and retrieval@1, with a paired percentile-bootstrap interval
(`eval/stats.py`).

Protocols (`--protocol`):
- `ours` (default): the sender decodes greedily under the emoji grammar, so every reply is an emoji
  message and a system is measured by what it means, not by luck or format; held-out targets.
- `seed`: as seed 001's original evaluated, so a number can sit beside the seed's (held-out success
  rose from 15-20% to 54% after RL there): the sender samples at T 0.7 with no constraint, the parser
  is the filter (a reply that is no emoji message is a format violation and ends the game; with no
  earlier guess its similarity is 0), and success@0.7 is the headline. Unlike the original we keep the
  held-out targets (it evaluated on its training prompts).

Writes a table, `retrieval.json` (rows, comparisons and one record per message: what each turn sent
and what the judge guessed) and `retrieval.png` to `output_dir`. Each record is appended to
`retrieval_records.jsonl` there as soon as its sender batch is played, under a first line holding the
config it depends on: a rerun with the same config plays only the games missing from it, and one with
another config is refused (delete the log, or choose another `--output_dir`).

    emoji-rl eval-retrieval --systems base sft=runs/sft/adapter rl=runs/grpo/adapter \
        teacher=data/sft_train.jsonl random --compare rl:sft sft:base rl:teacher
    emoji-rl eval-retrieval --config configs/gpu/eval_retrieval.yaml --protocol seed --modes single
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from tqdm.auto import tqdm

from emoji_rl.decode.generate import MAX_NEW_TOKENS
from emoji_rl.decode.sampler import HFSampler, Sample, Sampler
from emoji_rl.emoji.alphabet import MAX_EMOJI, MIN_EMOJI, parse_message, random_answers
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.emoji.stats import reply_stats
from emoji_rl.errors import DataError, UserError
from emoji_rl.eval.intervals import bootstrap_mean, paired_bootstrap, verdict
from emoji_rl.game.judge_config import JudgeConfig
from emoji_rl.game.retrieval import SUCCESS_THRESHOLDS, RetrievalBuilder, RetrievalRules
from emoji_rl.game.types import Episode
from emoji_rl.io.jsonl import AppendLog, Record, read_jsonl, write_json
from emoji_rl.io.report import bar_figure, format_table
from emoji_rl.lm import models, template
from emoji_rl.lm.template import chat_ids
from emoji_rl.rl.rollout.collect import play
from emoji_rl.web.store import adapter_hash

if TYPE_CHECKING:
    from peft import PeftModel
    from transformers import PreTrainedTokenizerBase

    from emoji_rl.game.reward import Similarity

Mode = Literal["single", "multi"]
Protocol = Literal["ours", "seed"]
MODES: tuple[Mode, ...] = ("single", "multi")
COMPARED = ("similarity", "success@0.5", "success@0.7", "retrieval@1")
SEED_TEMPERATURE = 0.7
RANDOM_LENGTH = 3
LEVEL = 0.95
RECORDS_LOG = "retrieval_records.jsonl"
# The config fields a game's record depends on, besides the data and the systems (`fingerprint`). Not
# batch_size: a rerun with a smaller batch after running out of memory may go on from the log (a
# greedy game's record is the same at any batch size, to float rounding).
RESULT_FIELDS = (
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


@dataclass(frozen=True)
class System:
    """One sender under evaluation: the base model, a LoRA adapter on it, or fixed answers."""

    name: str
    kind: Literal["base", "adapter", "teacher", "random"]
    path: str | None = None

    @property
    def fixed(self) -> bool:
        """Answers given in advance, one message per target: single-turn only."""
        return self.kind in ("teacher", "random")


@dataclass
class Config(JudgeConfig):
    """Evaluate senders on the retrieval game, with paired intervals of their differences."""

    model: str = field(default=models.SMOLLM2, metadata={"help": "base model spec of every system"})
    # Greedy: every system's emoji read the same way, so a difference between systems is the senders'.
    judge_temperature: float = field(
        default=0.0,
        metadata={"help": "the judge's sampling temperature; 0 = greedy, deterministic", "min": 0.0},
    )
    systems: list[str] = field(
        default_factory=lambda: ["base"],
        metadata={
            "help": "systems to compare: `base`, NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter), "
            "teacher=FILE.jsonl (SFT split records: the teacher's answers) and `random`"
        },
    )
    compare: list[str] = field(
        default_factory=list,
        metadata={"help": "pairs A:B to report mean(A - B) with a paired interval; none: adjacent systems"},
    )
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
    data: str = field(
        default="data/rl_eval.jsonl", metadata={"help": "held-out targets, JSONL with `target`"}
    )
    max_examples: int = field(default=0, metadata={"help": "evaluate at most this many targets (0 = all)"})
    reference_examples: int = field(
        default=0,
        metadata={
            "help": "base, teacher and random play only the first N targets (0 = all); adapters play them "
            "all. The smallest difference measured is between adapters (RL - SFT): spend the messages there"
        },
    )
    output_dir: str = field(default="reports/retrieval", metadata={"help": "where the JSON and PNG go"})
    max_turns: int = field(default=5, metadata={"help": "turns of the multi-turn game", "min": 1})
    tau: float = field(default=0.85, metadata={"help": "similarity that ends a multi-turn game early"})
    distractors: int = field(
        default=10, metadata={"help": "K: candidates (target + K-1 others) for retrieval@1"}
    )
    temperature: float | None = field(
        default=None,
        metadata={"help": "sender sampling temperature; none: the protocol's (ours 0 = greedy, seed 0.7)"},
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
    max_new_tokens: int = field(default=MAX_NEW_TOKENS, metadata={"help": "token budget of one sender turn"})
    min_emoji: int = field(default=MIN_EMOJI, metadata={"help": "fewest emoji in a valid turn"})
    max_emoji: int = field(default=MAX_EMOJI, metadata={"help": "most emoji in a valid turn"})
    random_length: int = field(
        default=RANDOM_LENGTH,
        metadata={"help": "emoji per `random` answer where no teacher answer gives the length"},
    )
    similarity_model: str = field(default=models.MINILM, metadata={"help": "sentence embedder"})
    batch_size: int = field(default=32, metadata={"help": "episodes per generate call"})
    resamples: int = field(default=2000, metadata={"help": "bootstrap resamples per interval"})
    seed: int = field(default=0, metadata={"help": "seed for sampling, distractors, random emoji, bootstrap"})

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
        if self.reference_examples < 0:
            raise ValueError(f"reference_examples={self.reference_examples} must be >= 0 (0 = all targets)")
        searched = self.num_beams > 1 or self.guidance_scale != 1.0
        if searched and (self.protocol != "ours" or self.sender_temperature > 0):
            raise ValueError(
                f"num_beams={self.num_beams}, guidance_scale={self.guidance_scale} need the greedy, "
                f"emoji-constrained sender of protocol ours (got protocol {self.protocol}, temperature "
                f"{self.sender_temperature})"
            )
        compare_pairs(self.compare, eval_systems(self.systems))

    @property
    def sender_temperature(self) -> float:
        if self.temperature is not None:
            return self.temperature
        return SEED_TEMPERATURE if self.protocol == "seed" else 0.0


def parse_systems(specs: Sequence[str]) -> dict[str, str | None]:
    """Model senders (also read by eval-wordle and play-web): `base` -> no adapter; `NAME=DIR` -> that
    adapter. Names must be unique."""
    systems: dict[str, str | None] = {}
    for spec in specs:
        name, _, adapter = spec.partition("=")
        if not name or (spec != "base" and not adapter):
            raise ValueError(f"system {spec!r}: use `base` or NAME=ADAPTER_DIR")
        if name in systems:
            raise ValueError(f"system name {name!r} appears twice in systems")
        systems[name] = adapter or None
    return systems


def eval_systems(specs: Sequence[str]) -> dict[str, System]:
    """`parse_systems`' senders, and the fixed answers `random` and `teacher=FILE`, in the given order."""
    fixed = {s.partition("=")[0] for s in specs if s == "random" or s.startswith("teacher=")}
    senders = parse_systems([s for s in specs if s.partition("=")[0] not in fixed])
    if len(fixed) + len(senders) < len(specs):
        raise ValueError(f"a system name appears twice in systems {list(specs)}")
    systems = {}
    for spec in specs:
        name, _, path = spec.partition("=")
        if name in fixed:
            systems[name] = System(name, name, path or None)  # type: ignore[arg-type]
        else:
            systems[name] = System(name, "base" if senders[name] is None else "adapter", senders[name])
    return systems


def compare_pairs(specs: Sequence[str], systems: dict[str, System]) -> list[tuple[str, str]]:
    """`A:B` pairs, each name a system; none given: each adjacent pair in `systems` order."""
    names = list(systems)
    if not specs:
        return list(zip(names[1:], names[:-1], strict=True))
    pairs = []
    for spec in specs:
        a, _, b = spec.partition(":")
        if a not in systems or b not in systems or a == b:
            raise ValueError(f"compare {spec!r}: use A:B, two different systems of {names}")
        pairs.append((a, b))
    return pairs


def teacher_answers(path: str, targets: Sequence[str]) -> list[str | None]:
    """Per target, the teacher's answer from SFT split records (`target`, and `messages` whose last
    assistant turn holds the emoji), or None where the file has no record of that target."""
    answers: dict[str, str] = {}
    for number, record in enumerate(read_jsonl(path, hint="the teacher's SFT split (`emoji-rl teacher`)"), 1):
        said = [m.get("content") for m in record.get("messages") or [] if m.get("role") == "assistant"]
        if not isinstance(record.get("target"), str) or not said or not isinstance(said[-1], str):
            raise DataError(
                path, number, "record needs a string `target` and an assistant turn in `messages`"
            )
        answers[record["target"]] = said[-1]
    return [answers.get(t) for t in targets]


def load_systems(base: torch.nn.Module, systems: dict[str, str | None]) -> PeftModel | torch.nn.Module:
    """All adapters on one copy of the base weights, one PEFT adapter per system."""
    from peft import PeftModel

    adapters = {name: path for name, path in systems.items() if path}
    for name, path in adapters.items():
        require_adapter(name, path)
    model: torch.nn.Module = base
    for name, path in adapters.items():
        if isinstance(model, PeftModel):
            model.load_adapter(path, adapter_name=name)
        else:
            model = PeftModel.from_pretrained(base, path, adapter_name=name)
    model.eval()
    return model


def require_adapter(name: str, path: str) -> None:
    if not (Path(path) / "adapter_config.json").is_file():
        raise UserError(f"system {name}: {path} has no adapter_config.json (is it a PEFT adapter directory?)")


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


class FixedSender:
    """A sender whose one message per game is given in advance (teacher or random emoji), in the
    order of the games, which it is asked for in that order (a batch at a time): the judge reads them
    through the same game as a model's."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, answers: Sequence[str]) -> None:
        stop = template.stop_token_id(tokenizer)
        self.samples = [
            Sample((*tokenizer(a, add_special_tokens=False)["input_ids"], stop), ()) for a in answers
        ]
        self.given = 0

    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        assert previous is None or not any(previous), "a fixed sender has no second turn"
        batch = self.samples[self.given : self.given + len(prompts)]
        assert len(batch) == len(prompts), f"{len(prompts)} games asked for, {len(batch)} answers left"
        self.given += len(batch)
        return batch


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
    a tie is a miss, as in `reward.retrieval_at_1`. One embedding call for all."""
    pairs = [(c, g) for cands, g in zip(candidates, guesses, strict=True) for c in cands]
    scores = similarity.similarity([c for c, _ in pairs], [g for _, g in pairs])
    hits, start = [], 0
    for cands in candidates:
        row, start = scores[start : start + len(cands)], start + len(cands)
        hits.append(all(row[0] > other for other in row[1:]))
    return hits


def episode_record(episode: Episode, system: str, mode: str, record: Record, index: int) -> Record:
    """One message's game: what each turn sent and what the judge guessed, the final similarity."""
    final = episode.turns[-1].result
    turns = [
        {k: v for k, v in turn.result.log.items() if k in ("emoji", "guess", "violation")}
        for turn in episode.turns
    ]
    return {
        "system": system,
        "mode": mode,
        "id": str(record.get("id", index)),
        "target": record["target"],
        "turns": turns,
        "similarity": final.metrics["similarity"],
        "violation": bool(final.metrics["format_violation"]),
    }


def final_guess(record: Record) -> str:
    return next((t["guess"] for t in reversed(record["turns"]) if "guess" in t), "[unknown]")


def sent_texts(records: Sequence[Record]) -> tuple[list[str], list[bool]]:
    """Every turn's message and whether the game took it: a turn it refused (cut off by the token
    budget, or no emoji message) counts for no emoji, whatever its text."""
    turns = [t for r in records for t in r["turns"]]
    return [t.get("emoji", "") for t in turns], ["violation" not in t for t in turns]


def summarize(records: Sequence[Record], cfg: Config) -> dict[str, float | int | None]:
    """A system's row in one mode, from its per-message records (those with `retrieved` set)."""
    n = len(records)
    similarity = bootstrap_mean([r["similarity"] for r in records], cfg.resamples, cfg.seed, LEVEL)
    texts, stopped = sent_texts(records)
    stats = reply_stats(texts, cfg.min_emoji, cfg.max_emoji, stopped=stopped)
    return {
        "n": n,
        "similarity": similarity.mean,
        "similarity_lo": similarity.low,
        "similarity_hi": similarity.high,
        **{f"success@{t}": sum(r["similarity"] >= t for r in records) / n for t in SUCCESS_THRESHOLDS},
        "turns": sum(len(r["turns"]) for r in records) / n,
        "violations": sum(r["violation"] for r in records) / n,
        f"retrieval@1/{cfg.distractors}": sum(r["retrieved"] for r in records) / n,
        **{k: v for k, v in asdict(stats).items() if k not in ("replies", "compliance")},
    }


def not_applicable(system: System, mode: str) -> Record:
    return {"system": system.name, "mode": mode, "n": 0, "note": "n/a: one fixed message per target"}


def comparisons(
    records: Sequence[Record], pairs: Sequence[tuple[str, str]], resamples: int, seed: int
) -> list[Record]:
    """mean(A - B) per pair, mode and compared metric over the messages both systems played, with
    its paired interval; a pair with no message in common in a mode is left out."""
    by_key = {(r["system"], r["mode"], r["id"]): r for r in records}
    modes = list(dict.fromkeys(r["mode"] for r in records))
    out = []
    for a, b in pairs:
        for mode in modes:
            ids = [i for (s, m, i) in by_key if s == a and m == mode and (b, mode, i) in by_key]
            if not ids:
                continue
            for metric in COMPARED:
                value = metric_of(metric)
                diff = paired_bootstrap(
                    [value(by_key[a, mode, i]) for i in ids],
                    [value(by_key[b, mode, i]) for i in ids],
                    resamples,
                    seed,
                    LEVEL,
                )
                out.append({"a": a, "b": b, "mode": mode, "metric": metric, "n": len(ids), **asdict(diff)})
    return out


def metric_of(metric: str):
    """A per-message value of a compared metric: the similarity, or as 0/1 success at a threshold or
    whether the guess picked out its target (retrieval@1)."""
    if metric == "similarity":
        return lambda r: r["similarity"]
    if metric == "retrieval@1":
        return lambda r: float(r["retrieved"])
    threshold = float(metric.removeprefix("success@"))
    return lambda r: float(r["similarity"] >= threshold)


def format_comparisons(rows: Sequence[Record]) -> str:
    lines = [
        f"{r['a']} - {r['b']} ({r['mode']}, {r['n']} messages) {r['metric']:<12} "
        f"{r['mean']:+.3f}  [{r['low']:+.3f}, {r['high']:+.3f}]"
        + ("" if (v := verdict(r["low"], r["high"])) == "includes 0" else f"  {v}")
        for r in rows
        if r["low"] is not None
    ]
    return "\n".join(lines)


def main(cfg: Config) -> None:
    from emoji_rl.game.judge import NAMES_CAVEAT
    from emoji_rl.game.reward import Similarity

    records = read_jsonl(cfg.data, hint="make it with `emoji-rl rl-prompts` (it writes the held-out split)")
    if cfg.max_examples:
        records = records[: cfg.max_examples]
    for number, record in enumerate(records, 1):
        if not isinstance(record.get("target"), str):
            raise DataError(cfg.data, number, "record has no string `target`")
    ids = message_ids(records, cfg.data)
    targets = [r["target"] for r in records]
    systems = eval_systems(cfg.systems)
    pairs = compare_pairs(cfg.compare, systems)
    candidates = distractor_sets(targets, cfg.distractors, cfg.seed)
    fixed = fixed_answers(systems, targets, cfg)
    plan = {
        (system.name, mode): played_indices(
            system, fixed.get(system.name), len(records), cfg.reference_examples
        )
        for system in systems.values()
        for mode in cfg.modes
        if not (system.fixed and mode == "multi")
    }
    with AppendLog(Path(cfg.output_dir) / RECORDS_LOG) as log:
        logged = logged_records(log, fingerprint(cfg, ids, targets, systems, fixed))
        reused = sum(
            (name, mode, ids[i]) in logged for (name, mode), indices in plan.items() for i in indices
        )
        if reused:
            print(f"eval-retrieval: reusing {reused} records from {log.path}, playing the rest", flush=True)
        runtime = models.pick_runtime()
        tokenizer = models.load_tokenizer(cfg.model)
        senders = {s.name: s.path for s in systems.values() if not s.fixed}
        model = load_systems(models.load_causal_lm(cfg.model, runtime), senders) if senders else None
        judge = cfg.build_judge(runtime)
        similarity = Similarity(models.load_embedder(cfg.similarity_model, device=runtime.device))
        rows: list[Record] = []
        played: list[Record] = []
        for system in systems.values():
            for mode in cfg.modes:
                if (system.name, mode) not in plan:
                    rows.append(not_applicable(system, mode))
                    continue
                start = time.perf_counter()
                rules = RetrievalRules(
                    max_turns=1 if mode == "single" else cfg.max_turns,
                    tau=cfg.tau,
                    min_emoji=cfg.min_emoji,
                    max_emoji=cfg.max_emoji,
                )
                builder = RetrievalBuilder(tokenizer, judge, similarity, rules)
                indices = plan[system.name, mode]
                done = {i for i in indices if (system.name, mode, ids[i]) in logged}
                todo = unplayed_batches(indices, cfg.batch_size, done)
                sender: Sampler
                using: contextlib.AbstractContextManager[None]
                if system.fixed:
                    sender = FixedSender(tokenizer, [fixed[system.name][i] for batch in todo for i in batch])
                    using = contextlib.nullcontext()
                else:
                    assert model is not None
                    sender = model_sender(model, tokenizer, cfg)
                    using = active_system(model, system.name, system.path)
                with using:
                    batches = play_batches(
                        builder, records, todo, sender, cfg.seed, f"{system.name} {mode}-turn"
                    )
                    for batch, episodes in batches:
                        mine = [
                            episode_record(e, system.name, mode, records[i], i)
                            for e, i in zip(episodes, batch, strict=True)
                        ]
                        hits = retrieved(
                            similarity, [candidates[i] for i in batch], [final_guess(r) for r in mine]
                        )
                        for record, hit in zip(mine, hits, strict=True):
                            record["retrieved"] = hit
                            # A batch cut short by a crash is replayed whole; what it logged stands.
                            if (system.name, mode, record["id"]) not in logged:
                                log.append(record)
                                logged[system.name, mode, record["id"]] = record
                mine = [logged[system.name, mode, ids[i]] for i in indices]
                played.extend(mine)
                rows.append({"system": system.name, "mode": mode, **summarize(mine, cfg)})
                print(
                    f"eval-retrieval: {system.name} {mode}-turn: similarity {rows[-1]['similarity']:.3f} "
                    f"({len(mine)} messages, {len(mine) - len(done)} played in "
                    f"{time.perf_counter() - start:.0f} s)",
                    flush=True,
                )
    compared = comparisons(played, pairs, cfg.resamples, cfg.seed)
    write_outputs(
        cfg,
        judge.describe(),
        len(records),
        rows,
        compared,
        played,
        teacher_emoji(systems, fixed, cfg),
        NAMES_CAVEAT if cfg.judge_reads_names else None,
    )


def message_ids(records: Sequence[Record], path: str) -> list[str]:
    """Each message's id (its index where it has none): records, the log and comparisons are keyed by
    it, so two messages may not share one."""
    ids = [str(r.get("id", i)) for i, r in enumerate(records)]
    first: dict[str, int] = {}
    for number, message in enumerate(ids, 1):
        if first.setdefault(message, number) != number:
            raise DataError(path, number, f"id {message!r} again (first on line {first[message]})")
    return ids


def sha256(value: object) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()[:16]


def fingerprint(
    cfg: Config,
    ids: Sequence[str],
    targets: Sequence[str],
    systems: dict[str, System],
    fixed: dict[str, list[str | None]],
) -> Record:
    """What a game's record depends on besides its system, mode and message: the messages (every
    target is another's distractor), what each system is (its adapter's files, not its path: a stage
    rerun retrains into the same directory; or its fixed answers, which the teacher's file, `seed` and
    `random_length` decide) and `RESULT_FIELDS`."""
    return {
        "data": sha256([ids, targets]),
        "systems": {s.name: system_fingerprint(s, fixed.get(s.name)) for s in systems.values()},
        **{key: getattr(cfg, key) for key in RESULT_FIELDS},
    }


def system_fingerprint(system: System, answers: Sequence[str | None] | None) -> str:
    if system.kind == "adapter":
        assert system.path is not None
        # Checked here, before the log keeps this hash, and not only when the adapters load.
        require_adapter(system.name, system.path)
        return f"adapter sha256:{str(adapter_hash(system.path))[:16]}"
    return "base" if answers is None else f"answers {sha256(answers)}"


def _flat(config: Record) -> Record:
    systems = {f"system {name}": spec for name, spec in config["systems"].items()}
    return {**{k: v for k, v in config.items() if k != "systems"}, **systems}


def logged_records(log: AppendLog, fingerprint: Record) -> dict[tuple[str, str, str], Record]:
    """The records in `log` by (system, mode, id), if the config lines that head its runs agree with
    `fingerprint`: each key equal, and each system in both the same (a system only one side has is
    fine). A run that brings a system of its own logs its config, so later runs check that one too."""
    config = json.loads(json.dumps(fingerprint))  # as the log holds it
    heads = [r["config"] for r in log.records if "config" in r]
    records = [r for r in log.records if "config" not in r]
    if records and not heads:
        raise UserError(
            f"{log.path} holds records but not the config that made them: delete it to start over, "
            "or choose another --output_dir"
        )
    stored = {k: v for head in heads for k, v in _flat(head).items()}
    current = _flat(config)
    for key in dict.fromkeys([*current, *stored]) if stored else ():
        one_sided = key.startswith("system ") and (key not in current or key not in stored)
        if current.get(key) != stored.get(key) and not one_sided:
            raise UserError(
                f"{log.path} holds the records of another config: {key} is {stored.get(key)!r} there and "
                f"{current.get(key)!r} here. Delete {log.path} to start over, or choose another --output_dir"
            )
    if current.keys() - stored.keys():
        log.append({"config": config})
    return {(r["system"], r["mode"], r["id"]): r for r in records}


def played_indices(system: System, answers: Sequence[str | None] | None, n: int, reference: int) -> list[int]:
    """The targets a system plays: all `n`, or the first `reference` for a system without an adapter
    of its own (base, teacher, random) when `reference` > 0, and of those only the ones a fixed
    system has an answer for."""
    limit = min(n, reference) if reference and system.kind != "adapter" else n
    return [i for i in range(limit) if answers is None or answers[i] is not None]


def unplayed_batches(indices: Sequence[int], batch_size: int, done: set[int]) -> list[list[int]]:
    """The sender batches of `indices` with a game not logged yet, cut as a whole run cuts them: a
    batch's draws follow from its first message (`batch_seed`), so one that a crash cut short is
    replayed whole and draws as it did."""
    batches = [list(indices[k : k + batch_size]) for k in range(0, len(indices), batch_size)]
    return [batch for batch in batches if not done.issuperset(batch)]


def batch_seed(seed: int, first: int) -> int:
    """Torch's seed for the sender batch that starts at message `first`. The same for every system and
    mode, so a sampled judge or sender differs by its inputs only; and not carried over from the batch
    before, so a rerun that plays only the missing batches draws as a whole run does."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{first}".encode()).digest()[:8], "little")


def play_batches(
    builder: RetrievalBuilder,
    records: Sequence[Record],
    batches: Sequence[Sequence[int]],
    sender: Sampler,
    seed: int,
    desc: str,
) -> Iterator[tuple[Sequence[int], list[Episode]]]:
    """Each batch's games played to their end, a batch at a time under a progress bar (a system takes
    minutes on a CPU), with the episodes of each as it ends."""
    with tqdm(total=sum(map(len, batches)), desc=desc, unit="msg") as bar:
        for batch in batches:
            torch.manual_seed(batch_seed(seed, batch[0]))
            yield batch, asyncio.run(play([builder(records[i]) for i in batch], sender))
            bar.update(len(batch))


def teacher_system(systems: dict[str, System]) -> System | None:
    """The system that plays the teacher's own answers, if one was given."""
    return next((s for s in systems.values() if s.kind == "teacher"), None)


def fixed_answers(
    systems: dict[str, System], targets: Sequence[str], cfg: Config
) -> dict[str, list[str | None]]:
    """The teacher's and the random system's answer per target (None: the teacher has none); random
    answers have the teacher's length for the message where there is one."""
    answers: dict[str, list[str | None]] = {}
    teacher = teacher_system(systems)
    if teacher is not None:
        answers[teacher.name] = teacher_answers(str(teacher.path), targets)
        if not any(answers[teacher.name]):
            raise UserError(
                f"{teacher.path} answers none of the {len(targets)} targets of {cfg.data}: "
                "give the SFT split that holds them (sft_test.jsonl for the SFT test split; sft_train.jsonl "
                "for rl-prompts' rl_eval.jsonl, whose targets it takes from outside sft_test)"
            )
        for target, answer in zip(targets, answers[teacher.name], strict=True):
            if answer is not None and not parse_message(answer, cfg.min_emoji, cfg.max_emoji).ok:
                raise UserError(
                    f"{teacher.path}: the answer {answer!r} for {target!r} is not an emoji message"
                )
    if "random" in systems:
        matched = answers[teacher.name] if teacher is not None else [None] * len(targets)
        lengths = [cfg.random_length if a is None else len(parse_message(a).emoji) for a in matched]
        answers["random"] = list(random_answers(lengths, cfg.seed))
    return answers


def teacher_emoji(
    systems: dict[str, System], fixed: dict[str, list[str | None]], cfg: Config
) -> Record | None:
    """Emoji statistics of the teacher's answers to every target it answered, played or not: the data a
    sender's distinct emoji and entropy on the whole split are measured against, when `reference_examples`
    lets the teacher play only the first few."""
    teacher = teacher_system(systems)
    if teacher is None:
        return None
    answers = [a for a in fixed[teacher.name] if a is not None]
    return {"system": teacher.name, **asdict(reply_stats(answers, cfg.min_emoji, cfg.max_emoji))}


def model_sender(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, cfg: Config) -> HFSampler:
    """The protocol's sender: emoji-constrained (ours), or free text the parser filters (seed)."""
    return HFSampler(
        model,
        tokenizer,
        "grammar" if cfg.protocol == "ours" else "none",
        cfg.sender_temperature,
        cfg.max_new_tokens,
        cfg.batch_size,
        cfg.min_emoji,
        cfg.max_emoji,
        cfg.num_beams,
        cfg.guidance_scale,
        chat_ids(tokenizer, sender_messages("")),
    )


def write_outputs(
    cfg: Config,
    judge: str,
    examples: int,
    rows: list[Record],
    compared: list[Record],
    played: list[Record],
    teacher: Record | None,
    caveat: str | None,
) -> None:
    out = Path(cfg.output_dir)
    retrieval = f"retrieval@1/{cfg.distractors}"
    columns = [
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
    ]
    write_json(
        out / "retrieval.json",
        {
            "protocol": cfg.protocol,
            "sender_temperature": cfg.sender_temperature,
            "sender_num_beams": cfg.num_beams,
            "sender_guidance_scale": cfg.guidance_scale,
            "judge": judge,
            "data": cfg.data,
            "examples": examples,
            "distractors": cfg.distractors,
            "thresholds": list(SUCCESS_THRESHOLDS),
            "interval": f"{LEVEL:.0%} percentile bootstrap over messages, {cfg.resamples} resamples; "
            "comparisons paired (the same messages resampled for both systems)",
            "rows": rows,
            "comparisons": compared,
            "records": played,
            "teacher_emoji": teacher,
            "caveat": caveat,
        },
    )
    figure = bar_figure(
        rows,
        ["similarity", "success@0.5", "success@0.7", retrieval, "distinct_emoji"],
        group="mode",
        series="system",
        title=f"retrieval game ({cfg.protocol} protocol), judge {judge}",
        path=out / "retrieval.png",
    )
    print(f"\nprotocol {cfg.protocol}; judge: {judge}; {examples} held-out targets\n")
    print(format_table(rows, columns) + "\n")
    if compared:
        print(f"differences, mean over the same messages with {LEVEL:.0%} paired bootstrap intervals:")
        print(format_comparisons(compared) + "\n")
    if caveat:
        print(caveat)
    print(f"report: {out / 'retrieval.json'}\nplot:   {figure}")
