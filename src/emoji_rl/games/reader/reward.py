"""The reader's terminal reward: how close its final guess comes to the message (MiniLM similarity),
less `contrast` times how well that guess would fit other messages (`play/similarity.Background`), so
that a bland guess that fits every message earns nothing."""

from __future__ import annotations


def reader_reward(similarity: float, background: float, contrast: float) -> dict[str, float]:
    """The reward of a finished episode and its terms: sim_T - contrast * background_T.

    background_T is the final guess's mean similarity to a fixed sample of other messages. With
    contrast 1, "I am happy" scores about as much there as against its own target and earns about 0;
    a guess that carries this message's content keeps its similarity. Terminal only, as the
    retrieval game's: the reader is paid for where the game ends, not for each guess on the way."""
    terms = {"similarity": similarity, "contrast": -contrast * background}
    return {**terms, "total": sum(terms.values())}
