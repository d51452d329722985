"""The retrieval game's terminal reward (docs/DESIGN.md §3): the final guess's similarity, a success
bonus, costs for turns, a broken format and repeated emoji, and the contrast term."""

from __future__ import annotations

from dataclasses import dataclass


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
