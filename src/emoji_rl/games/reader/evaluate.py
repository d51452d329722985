"""`emoji-rl eval-reader`: the reader's seat on held-out messages (docs/DESIGN.md §13), readers side
by side, with the differences between them as paired 95% bootstrap intervals (the evaluation path:
game/evaluate.py; this game's part of it: games/reader/evaluation.py).

Systems: `base` (the base model as reader) and NAME=ADAPTER_DIR (a reader `grpo --game reader`
trained, e.g. rl=runs/reader-grpo/adapter). Each plays every held-out message of an SFT split (the
teacher's emoji first, then the frozen sender's after each guess below `tau`, up to `max_turns`
guesses), greedy by default, against the same sender and embedder. Reported per system: the final
guess's similarity (with its interval), the first guess's, the reward, success at 0.3 / 0.5 / 0.7,
turns, and the shares of games ending on `[unknown]`, cut off or with a failed sender answer;
`--compare A:B` (default: each adapter against `base`) the paired differences of the final and first
similarity and the reward. Writes a table, `reader.json` and `reader.png`; each game is appended to
`reader_records.jsonl` as its batch ends, so a rerun plays only the games missing there.

    emoji-rl eval-reader --data data/sft_test.jsonl --systems base rl=runs/reader-grpo/adapter
    emoji-rl eval-reader --data runs/reader/data/sft_test.jsonl --max_turns 2 --output_dir reports/reader \\
        --systems base s16=runs/reader-grpo/checkpoints/step-000016/adapter rl=runs/reader-grpo/adapter
"""

from __future__ import annotations

from dataclasses import dataclass, field

from emoji_rl.config import override
from emoji_rl.decode.sampler import SamplingConfig
from emoji_rl.decode.senders import parse_systems
from emoji_rl.errors import UserError
from emoji_rl.game.evaluate import evaluate
from emoji_rl.game.evaluation import EvalConfig
from emoji_rl.game.similarity import ContrastConfig, SimilarityConfig
from emoji_rl.games.reader.game import ReaderConfig
from emoji_rl.games.reader.grpo import GAME
from emoji_rl.games.reader.partner import PartnerConfig

BASE = "base"
# The reader writes one sentence of under 15 words (the judge's prompt); the cpu profile trains at 32.
MAX_NEW_TOKENS = 32


@dataclass
class Config(EvalConfig, ReaderConfig, PartnerConfig, SimilarityConfig, ContrastConfig, SamplingConfig):
    """Evaluate readers on the reader's seat: base vs adapters, paired intervals of the differences."""

    compare: list[str] = field(
        default_factory=list,
        metadata={
            "help": "pairs A:B to report mean(A - B) with a paired interval; none: each adapter vs base"
        },
    )
    data: str = override(
        EvalConfig,
        "data",
        "data/sft_test.jsonl",
        help="held-out SFT split: `target` and the teacher's emoji as the last assistant turn of `messages`",
    )
    output_dir: str = override(EvalConfig, "output_dir", "reports/reader")
    # As the reader profiles train (configs/*/grpo.reader.yaml): the reward read as it was trained.
    contrast: float = override(
        ContrastConfig,
        "contrast",
        1.0,
        help="times the final guess's mean similarity to contrast_messages held-out messages, subtracted "
        "in the reward (0: the reward is the similarity)",
    )
    temperature: float = override(
        SamplingConfig, "temperature", 0.0, help="the reader's sampling temperature; 0 = greedy"
    )
    max_new_tokens: int = override(
        SamplingConfig, "max_new_tokens", MAX_NEW_TOKENS, help="token budget of one guess"
    )

    result_fields = (
        "model",
        "max_turns",
        "tau",
        "reader_view",
        "temperature",
        "max_new_tokens",
        "min_emoji",
        "max_emoji",
        "partner",
        "partner_model",
        "partner_adapter",
        "partner_url",
        "partner_temperature",
        "partner_max_new_tokens",
        "similarity_model",
        "contrast",
        "contrast_messages",
        "seed",
    )

    def __post_init__(self) -> None:
        names = list(parse_systems(self.systems))
        if not self.compare and BASE in names:
            self.compare = [f"{name}:{BASE}" for name in names if name != BASE]
        super().__post_init__()
        if self.partner == "openai" and (self.partner_url is None or self.partner_model is None):
            raise UserError(
                "partner=openai in an evaluation needs partner_url and partner_model: there is no policy "
                "server to fall back on"
            )


def main(cfg: Config) -> None:
    evaluate(GAME, cfg)
