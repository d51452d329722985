"""`emoji-rl reward-check`: is GRPO's reward a signal, or mostly the judge's own noise?

GRPO learns from the differences between the G replies of one group. Those differences come from
two sources: the replies differ (the signal), and a sampling judge guesses differently each time
it reads the same emoji (noise). This stage samples G sender replies for each of `groups` targets,
as a first GRPO turn would, has the judge read every reply twice and reports:

- `spread`: the variance of similarity inside a group (mean over groups), what advantages are made of;
- `noise`: the judge's variance on the same emoji, estimated from the two readings as E[(a-b)^2]/2;
- `noise_share`: noise / spread. Near 1, a group's ranking is mostly the judge's dice;
- `sign_agreement`: the share of replies whose advantage has the same sign under both readings
  (0.5 is a coin, 1.0 a judge that agrees with itself);
- `best_of_group_gain`: how much the best of G beats the group's mean: what RL could reach if it
  learned to write the best reply it already samples.

With `--judge_temperature 0` the two readings are equal and `noise` is 0 by construction; the check
then reports the spread and the headroom alone. Single-turn: the first turn is where every episode
starts. Similarities of invalid replies count as 0, as in the game before penalties.

    emoji-rl reward-check --adapter runs/sft/adapter --data data/rl_train.jsonl
    emoji-rl reward-check --adapter runs/sft/adapter --judge_temperature 0
"""

from __future__ import annotations

import logging
import random
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import torch

from emoji_rl.data.rl_prompts import round_trips
from emoji_rl.decode.generate import SamplingConfig, generate_replies
from emoji_rl.emoji.sender_prompts import sender_messages
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import read_jsonl, write_json
from emoji_rl.lm import models
from emoji_rl.play.judge_config import JudgeConfig
from emoji_rl.play.similarity import SimilarityConfig

log = logging.getLogger(__name__)


@dataclass
class Config(JudgeConfig, SimilarityConfig, SamplingConfig, models.ModelConfig):
    """Measure the reward's spread inside GRPO groups against the judge's noise."""

    adapter: str | None = field(
        default="runs/sft/adapter",
        metadata={"help": "the sender's LoRA adapter; none: the base model", "input": True},
    )
    data: str = field(
        default="data/rl_train.jsonl", metadata={"help": "targets, JSONL with `target`", "input": True}
    )
    groups: int = field(default=16, metadata={"help": "targets to sample groups for (a seeded sample)"})
    group_size: int = field(default=8, metadata={"help": "replies per target, as GRPO's group_size"})
    batch_size: int = field(default=32, metadata={"help": "replies per generate call"})
    seed: int = field(default=0, metadata={"help": "seed of the target sample and of all sampling"})
    output: str | None = field(default=None, metadata={"help": "write a JSON report here"})

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.groups < 1 or self.group_size < 2:
            raise ValueError(f"groups={self.groups}, group_size={self.group_size}: need >= 1 and >= 2")


@dataclass(frozen=True)
class NoiseReport:
    spread: float
    noise: float
    noise_share: float
    sign_agreement: float
    best_of_group_gain: float
    mean_similarity: float


def group_variance(groups: Sequence[Sequence[float]]) -> float:
    """Mean over groups of the population variance inside each group."""
    return statistics.fmean(statistics.pvariance(g) for g in groups)


def judge_noise(first: Sequence[float], second: Sequence[float]) -> float:
    """The variance of one reading from two independent readings of the same items: Var(a - b) = 2 var."""
    return statistics.fmean((a - b) ** 2 / 2 for a, b in zip(first, second, strict=True))


def sign_agreement(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]) -> float:
    """Share of replies whose advantage (value minus its group's mean) has the same sign under both
    readings; a reply at its group's mean in either reading counts as agreeing only if it is in both."""

    def signs(group: Sequence[float]) -> list[int]:
        mean = statistics.fmean(group)
        return [(v > mean) - (v < mean) for v in group]

    pairs = [
        (x, y) for a, b in zip(first, second, strict=True) for x, y in zip(signs(a), signs(b), strict=True)
    ]
    return sum(x == y for x, y in pairs) / len(pairs)


def noise_report(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]) -> NoiseReport:
    spread = group_variance(first)
    noise = judge_noise([v for g in first for v in g], [v for g in second for v in g])
    return NoiseReport(
        spread=spread,
        noise=noise,
        noise_share=noise / spread if spread > 0 else float("inf"),
        sign_agreement=sign_agreement(first, second),
        best_of_group_gain=statistics.fmean(max(g) - statistics.fmean(g) for g in first),
        mean_similarity=statistics.fmean(v for g in first for v in g),
    )


def main(cfg: Config) -> None:

    records = read_jsonl(cfg.data, hint="make it with `emoji-rl rl-prompts`")
    if len(records) < cfg.groups:
        raise UserError(f"{cfg.data} has {len(records)} targets, fewer than groups={cfg.groups}")
    targets = [r["target"] for r in random.Random(cfg.seed).sample(records, cfg.groups)]
    torch.manual_seed(cfg.seed)
    runtime = models.pick_runtime()
    sender = models.load_causal_lm(cfg.model, runtime, cfg.adapter)
    tokenizer = models.load_tokenizer(cfg.model)
    judge = cfg.build_judge(runtime)
    similarity = cfg.load_similarity(runtime)
    repeated = [t for t in targets for _ in range(cfg.group_size)]
    replies = generate_replies(
        sender,
        tokenizer,
        [sender_messages(t) for t in repeated],
        cfg.decoding(batch_size=cfg.batch_size),
        seed=cfg.seed,
        progress=True,
    )
    readings = []
    for _ in range(2):
        trips = round_trips(repeated, replies, judge, similarity, cfg.min_emoji, cfg.max_emoji)
        flat = [max(t.similarity, 0.0) for t in trips]
        readings.append([flat[i : i + cfg.group_size] for i in range(0, len(flat), cfg.group_size)])
    report = noise_report(*readings)
    print(f"judge {judge.describe()}; sender {cfg.adapter or cfg.model} at T {cfg.temperature:g}")
    print(f"{cfg.groups} groups of {cfg.group_size}:")
    for name, value in asdict(report).items():
        print(f"  {name:<20} {value:.4f}")
    if cfg.output:
        write_json(
            cfg.output,
            {
                "config": asdict(cfg),
                "judge": judge.describe(),
                "report": asdict(report),
                "targets": targets,
                "similarities": readings,
            },
        )
        print(f"report: {cfg.output}")
