"""`emoji-rl eval-retrieval`: the retrieval game on held-out messages, systems side by side, with the
differences between them as paired 95% bootstrap intervals (the evaluation path: game/evaluate.py;
this game's part of it: games/retrieval/evaluation.py).

Systems: `base` (the base model as sender), NAME=ADAPTER_DIR (e.g. sft=runs/sft/adapter),
`teacher=FILE.jsonl` (the teacher's own answer per target, read from SFT split records: `target` and
`messages`, whose last assistant turn is the emoji) and `random` (random alphabet emoji, as many per
message as the teacher's answer for it, else `random_length`). Each system plays every target
single-turn (one emoji message, one guess) and multi-turn (up to `max_turns`, the judge's guess shown
back to the sender); the teacher and random answers are one message, so their multi-turn rows are
n/a.

Differences can be believed because every system sees the same messages, the same distractors and
the same judge (greedy by default, so one emoji message always gets one guess): `--compare A:B`
(default: each adjacent pair in `systems` order) gives mean(A - B) over the messages both played
(`--reference_examples N` keeps base, teacher and random to the first N, so adapters can play more),
similarity, success@0.5 / 0.7 and retrieval@1, with a paired percentile-bootstrap interval.

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

from dataclasses import dataclass, field
from typing import Literal

from emoji_rl.config import override
from emoji_rl.decode.sampler import SamplingConfig
from emoji_rl.decode.senders import eval_systems
from emoji_rl.game.evaluate import evaluate
from emoji_rl.game.evaluation import EvalConfig
from emoji_rl.game.similarity import SimilarityConfig
from emoji_rl.games.retrieval.evaluation import DISTRACTORS
from emoji_rl.games.retrieval.game import RetrievalConfig
from emoji_rl.games.retrieval.grpo import GAME
from emoji_rl.games.retrieval.judge_config import JudgeConfig

Mode = Literal["single", "multi"]
Protocol = Literal["ours", "seed"]
MODES: tuple[Mode, ...] = ("single", "multi")
SEED_TEMPERATURE = 0.7
RANDOM_LENGTH = 3


@dataclass
class Config(EvalConfig, JudgeConfig, RetrievalConfig, SimilarityConfig, SamplingConfig):
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
    # Greedy: every system's emoji read the same way, so a difference between systems is the senders'.
    judge_temperature: float = override(
        JudgeConfig,
        "judge_temperature",
        0.0,
        help="the judge's sampling temperature; 0 = greedy, deterministic",
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


def main(cfg: Config) -> None:
    evaluate(GAME, cfg)
