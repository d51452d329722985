"""Similarity, retrieval@1 and the background similarity against hand-checked cases."""

from __future__ import annotations

import pytest
import torch
from tests.floats import F64

from emoji_rl.play.similarity import Background, Similarity, mean_similarity, retrieval_at_1


@pytest.fixture(scope="module")
def similarity(embedder):
    return Similarity(embedder)


def test_identical_text_scores_one(similarity):
    text = "Let's grab pizza and watch a movie tonight"
    assert similarity.similarity([text], [text])[0] == pytest.approx(1.0, abs=1e-4)


def test_paraphrase_beats_unrelated(similarity):
    target = "Let's grab pizza and watch a movie tonight"
    para, other = "We should eat pizza and see a film this evening", "My car broke down on the highway"
    close, far = similarity.similarity([target, target], [para, other])
    assert close > 0.6 > 0.2 > far


def test_similarity_is_per_pair_and_in_order(similarity):
    targets = ["I love my cat", "The train is late"]
    assert similarity.similarity(targets, ["cat", "train"]) == pytest.approx(
        [similarity.similarity([t], [g])[0] for t, g in zip(targets, ["cat", "train"], strict=True)], abs=1e-5
    )
    assert similarity.similarity([], []) == []
    with pytest.raises(AssertionError):
        similarity.similarity(["a"], [])


def test_repeated_texts_embed_to_the_same_row(similarity):
    vecs = similarity.embed(["pizza", "movie", "pizza"])
    assert vecs.shape == (3, 384)
    assert torch.equal(vecs[0], vecs[2])
    assert torch.linalg.vector_norm(vecs, dim=1) == pytest.approx([1.0, 1.0, 1.0], abs=1e-4)


def test_retrieval_at_1_counts_guesses_nearest_their_own_target():
    targets = torch.eye(3)
    assert retrieval_at_1(targets, targets) == 1.0
    assert retrieval_at_1(targets, targets[[1, 0, 2]]) == pytest.approx(1 / 3)
    # Two identical targets: neither guess singles out its own.
    twins = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    assert retrieval_at_1(twins, twins) == 0.0
    assert retrieval_at_1(torch.zeros(0, 4), torch.zeros(0, 4)) == 0.0


def test_retrieval_at_1_on_text(similarity):
    targets = ["Let's grab pizza tonight", "My flight got cancelled", "The baby said her first word"]
    assert similarity.retrieval_at_1(targets, ["pizza", "airplane, cancelled", "baby talking"]) == 1.0
    assert similarity.retrieval_at_1(targets, ["airplane", "baby", "pizza"]) == 0.0


def test_mean_similarity_skips_each_guess_own_target():
    guesses = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    references = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    # guess 0 against both: (1 + 0.6) / 2; guess 1 skips reference 0 (its own target): 0.8 / 1
    skip = torch.tensor([[False, False], [True, False]])
    assert mean_similarity(guesses, references, skip).tolist() == pytest.approx([0.8, 0.8])
    # A guess whose every reference is skipped scores 0, not NaN.
    assert mean_similarity(guesses[:1], references, torch.tensor([[True, True]])).tolist() == [0.0]


@pytest.mark.float_paths
def test_background_is_the_mean_similarity_to_the_other_messages(embedder_f64):
    # Three messages embedded in one batch against two: other padding, another order (tests/floats.py).
    similarity = Similarity(embedder_f64)
    messages = ["I love my cat", "The train is late", "Let's grab pizza tonight"]
    background = Background(similarity, messages)
    [own_left_out] = background.score(["I love my cat"], ["a cat"])
    others = similarity.similarity(messages[1:], ["a cat", "a cat"])
    assert own_left_out == pytest.approx(sum(others) / 2, abs=F64["atol"])
    # A guess that could answer any message fits the others better than one that carries its target.
    target = "My flight got cancelled"
    generic, specific = background.score(
        [target] * 2, ["I am so happy today, let's have fun!", "a flight was cancelled"]
    )
    assert generic > specific
    with pytest.raises(ValueError):
        Background(similarity, [])
