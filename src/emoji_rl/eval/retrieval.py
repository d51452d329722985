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
(`eval/intervals.py`).

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
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from tqdm.auto import tqdm

from emoji_rl.config import override
from emoji_rl.decode.sampler import Sampler, SamplingConfig
from emoji_rl.decode.senders import FixedSender, eval_systems, fixed_answers, model_sender, teacher_emoji
from emoji_rl.errors import DataError
from emoji_rl.eval.compare import LEVEL, compare_pairs, comparisons, final_guess, format_comparisons
from emoji_rl.eval.retrieval_records import (
    RECORDS_LOG,
    batch_seed,
    distractor_sets,
    episode_record,
    fingerprint,
    logged_records,
    message_ids,
    not_applicable,
    played_indices,
    retrieved,
    summarize,
    unplayed_batches,
)
from emoji_rl.game.play import play
from emoji_rl.game.similarity import SimilarityConfig
from emoji_rl.game.types import Episode
from emoji_rl.games.retrieval.game import (
    SUCCESS_THRESHOLDS,
    RetrievalBuilder,
    RetrievalConfig,
    RetrievalRules,
)
from emoji_rl.games.retrieval.judge_config import JudgeConfig
from emoji_rl.io.jsonl import AppendLog, Record, read_jsonl, write_json
from emoji_rl.io.report import bar_figure, format_table
from emoji_rl.lm import models
from emoji_rl.lm.adapters import active_system, load_systems

Mode = Literal["single", "multi"]
Protocol = Literal["ours", "seed"]
MODES: tuple[Mode, ...] = ("single", "multi")
SEED_TEMPERATURE = 0.7
RANDOM_LENGTH = 3


@dataclass
class Config(JudgeConfig, RetrievalConfig, SimilarityConfig, SamplingConfig, models.ModelConfig):
    """Evaluate senders on the retrieval game, with paired intervals of their differences."""

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
    distractors: int = field(
        default=10, metadata={"help": "K: candidates (target + K-1 others) for retrieval@1"}
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


def main(cfg: Config) -> None:
    from emoji_rl.game.similarity import Similarity
    from emoji_rl.games.retrieval.judge import NAMES_CAVEAT

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
    fixed = fixed_answers(
        systems, targets, cfg.data, cfg.min_emoji, cfg.max_emoji, cfg.random_length, cfg.seed
    )
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
                    decoding = cfg.decoding(
                        constraint="grammar" if cfg.protocol == "ours" else "none",
                        temperature=cfg.sender_temperature,
                        batch_size=cfg.batch_size,
                        num_beams=cfg.num_beams,
                        guidance_scale=cfg.guidance_scale,
                    )
                    sender = model_sender(model, tokenizer, decoding)
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
    teacher = teacher_emoji(systems, fixed, cfg.min_emoji, cfg.max_emoji)
    caveat = NAMES_CAVEAT if cfg.judge_reads_names else None
    write_outputs(cfg, judge.describe(), len(records), rows, compared, played, teacher, caveat)


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
