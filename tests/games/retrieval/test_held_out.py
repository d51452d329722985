"""The retrieval game's part of GRPO's held-out evaluation (`GameSetup.held_out_metrics`): per game,
what eval-retrieval compares, retrieval@1 among distractors drawn from the held-out targets."""

import pytest

from emoji_rl.games.retrieval.evaluation import DISTRACTORS, held_out_metrics
from emoji_rl.play.similarity import Similarity
from emoji_rl.play.types import Episode, StepResult, Turn

TARGETS = ["I love pizza", "the car broke down", "my cat is asleep", "we won the football match"]


def episode(guess: str, similarity: float) -> Episode:
    """A one-turn game whose judge guessed `guess`."""
    metrics = {"similarity": similarity, "format_violation": 0.0}
    result = StepResult(done=True, reward=similarity, metrics=metrics, log={"emoji": "🍕", "guess": guess})
    return Episode((Turn((1,), (2,), (0.0,), result),))


def records(targets):
    return [{"id": f"m{i}", "target": t} for i, t in enumerate(targets)]


@pytest.fixture
def metrics(embedder):
    return held_out_metrics(Similarity(embedder), seed=0)


def test_a_guess_that_is_its_target_is_retrieved_and_one_that_is_another_target_is_not(metrics):
    # Four distinct targets, fewer than DISTRACTORS: each is ranked among all four.
    held_out = records(TARGETS)
    own = metrics(held_out, [0, 1, 2, 3], [episode(t, 1.0) for t in TARGETS])
    assert [m["retrieval@1/4"] for m in own] == [1.0, 1.0, 1.0, 1.0]
    swapped = metrics(held_out, [0, 1, 2, 3], [episode(t, 0.2) for t in TARGETS[1:] + TARGETS[:1]])
    assert [m["retrieval@1/4"] for m in swapped] == [0.0, 0.0, 0.0, 0.0]
    # The other compared metrics, as eval-retrieval reads them from the final similarity.
    assert own[0] == {"similarity": 1.0, "success@0.5": 1.0, "success@0.7": 1.0, "retrieval@1/4": 1.0}
    assert swapped[0]["success@0.5"] == 0.0


def test_a_process_share_scores_its_records_as_the_whole_set_does(metrics):
    """Each process plays a share of the records, the last one repeated to fill the shares out; a
    record's figures do not depend on which others a process played, so gathering them is exact."""
    targets = [f"message number {i} about {topic}" for i, topic in enumerate("abcdefghijklmn")]
    held_out = records(targets)
    guesses = [episode(t if i % 3 else "something else entirely", 0.5) for i, t in enumerate(targets)]
    everyone = metrics(held_out, range(len(targets)), guesses)
    key = f"retrieval@1/{DISTRACTORS}"  # 14 distinct targets: the eval stage's K
    assert all(m[key] == 1.0 for i, m in enumerate(everyone) if i % 3)
    share = [1, 5, 13, 13]
    assert metrics(held_out, share, [guesses[i] for i in share]) == [everyone[i] for i in share]


def test_one_distinct_target_has_nothing_to_rank_it_among(metrics):
    held_out = records(["the same message", "the same message"])
    assert metrics(held_out, [0, 1], [episode("the same message", 1.0)] * 2) == [{}, {}]
