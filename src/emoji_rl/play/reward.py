"""The terminal rewards of the games that send and guess messages: the sender's (the retrieval game's,
docs/DESIGN.md §3: the final guess's similarity, a success bonus, costs for turns, a broken format and
repeated emoji, and the contrast term), with its weights as every such game's fields
(`SenderRewardConfig`), and the guesser's (the reader's, §13: its final guess's similarity less the
contrast term). No game owns them: a game that seats a sender or a guesser imports them from here."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the retrieval game's terminal reward (docs/DESIGN.md §3)."""

    success_bonus: float = 0.5
    turn_cost: float = 0.1
    format_penalty: float = 0.5
    repetition_penalty: float = 0.3
    contrast: float = 0.0


def terminal_reward(
    similarity: float,
    turns: int,
    violation: bool,
    unique_emoji: int,
    total_emoji: int,
    tau: float,
    weights: RewardWeights,
    background: float = 0.0,
) -> dict[str, float]:
    """The reward of a finished episode and its terms:

    sim_T + success_bonus*[sim_T >= tau] - turn_cost*T - format_penalty*[violation]
          - repetition_penalty*(1 - unique/total) - contrast*background_T

    background_T is the final guess's mean similarity to other messages (`Background`): with contrast 1
    the first and last terms reward what the guess says about this message and not about any message.

    Terminal only: per-turn similarity deltas summed into a return reward a weak first turn (the
    original's defect), since a bad first guess leaves more room to improve.
    """
    repetition = 1.0 - unique_emoji / total_emoji if total_emoji else 0.0
    terms = {
        "similarity": similarity,
        "success": weights.success_bonus * float(similarity >= tau),
        "turns": -weights.turn_cost * turns,
        "format": -weights.format_penalty * float(violation),
        "repetition": -weights.repetition_penalty * repetition,
        "contrast": -weights.contrast * background,
    }
    return {**terms, "total": sum(terms.values())}


@dataclass
class SenderRewardConfig:
    """The weights of the sender's reward (`terminal_reward`) as a game's fields; `contrast` is
    `ContrastConfig`'s (play/similarity.py)."""

    success_bonus: float = field(default=0.5, metadata={"help": "reward added when similarity >= tau"})
    turn_cost: float = field(default=0.1, metadata={"help": "reward subtracted per turn used"})
    format_penalty: float = field(default=0.5, metadata={"help": "reward subtracted for an invalid turn"})
    repetition_penalty: float = field(
        default=0.3, metadata={"help": "times (1 - unique/total emoji); the original: none"}
    )

    def reward_weights(self, contrast: float) -> RewardWeights:
        """These weights, with the contrast term's."""
        return RewardWeights(
            self.success_bonus, self.turn_cost, self.format_penalty, self.repetition_penalty, contrast
        )


def reader_reward(similarity: float, background: float, contrast: float) -> dict[str, float]:
    """The guesser's reward of a finished episode and its terms: sim_T - contrast * background_T.

    background_T is the final guess's mean similarity to a fixed sample of other messages. With
    contrast 1, "I am happy" scores about as much there as against its own target and earns about 0;
    a guess that carries this message's content keeps its similarity. Terminal only, as the
    sender's: the reader is paid for where the game ends, not for each guess on the way."""
    terms = {"similarity": similarity, "contrast": -contrast * background}
    return {**terms, "total": sum(terms.values())}
