"""The offline teacher: valid, diverse and topical answers, batch-independent, embeddings cached."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from emoji_rl.data.offline_teacher import OfflineTeacher, content_queries
from emoji_rl.emoji.alphabet import parse_message

SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples" / "messages.txt"
EDGE_CASES = [
    "",
    "ok",
    "!!! ??? ...",
    "lol",
    "Thanks so much!",
    "Je voudrais un croissant et un café, s'il vous plaît",
    " ".join(["pizza beach guitar dog rain snow coffee train airplane money music book"] * 3),
]


@pytest.fixture(scope="module")
def teacher(embedder) -> OfflineTeacher:
    return OfflineTeacher(embedder)  # the user cache, as the stages use it: computed once per machine


@pytest.fixture(scope="module")
def sample_answers(teacher) -> list[tuple[str, str]]:
    messages = SAMPLES.read_text().splitlines() + EDGE_CASES
    return list(zip(messages, teacher.answer(messages), strict=True))


def test_every_answer_is_a_valid_message(sample_answers):
    for message, answer in sample_answers:
        assert parse_message(answer).ok, (message, answer)


def test_answers_repeat_no_emoji_and_no_near_synonyms(teacher, sample_answers):
    index = {e: i for i, e in enumerate(teacher.emoji)}
    for message, answer in sample_answers:
        emoji = parse_message(answer).emoji
        assert len(set(emoji)) == len(emoji), (message, emoji)
        vecs = teacher._main_vecs[[index[e] for e in emoji]]
        sims = (vecs @ vecs.T).fill_diagonal_(0)
        assert sims.max() < teacher.max_redundancy, (message, emoji)


def test_answers_use_more_than_a_handful_of_emoji(sample_answers):
    used = [e for _, answer in sample_answers for e in parse_message(answer).emoji]
    assert len(set(used)) >= 0.7 * len(used)


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Let's grab pizza and watch a movie tonight", "🍕"),
        ("My cat knocked the birthday cake off the table", "🐈"),
        ("My cat knocked the birthday cake off the table", "🎂"),
        ("We are going camping in the mountains next month", "🏕️"),
        ("I play the guitar every evening", "🎸"),
    ],
)
def test_answers_are_topical(teacher, message, expected):
    assert expected in parse_message(teacher.answer([message])[0]).emoji


def test_emoji_count_bounds_are_respected(embedder):
    teacher = OfflineTeacher(embedder, min_emoji=3, max_emoji=4)
    for answer in teacher.answer(["ok", SAMPLES.read_text().splitlines()[0], EDGE_CASES[-1]]):
        assert parse_message(answer, 3, 4).ok, answer


def test_an_answer_does_not_depend_on_the_rest_of_the_batch(teacher):
    messages = ["I burned the toast", "We saw a whale on the boat tour", "ok"]
    assert teacher.answer(messages) == [teacher.answer([m])[0] for m in messages]


def test_a_restricted_teacher_answers_only_with_the_emoji_its_own_answers_use_often(embedder, sample_answers):
    teacher = OfflineTeacher(embedder)  # its own: restricting the shared fixture would leak into other tests
    messages = [m for m, _ in sample_answers]
    counts: dict[str, int] = {}
    for _, answer in sample_answers:
        for e in parse_message(answer).emoji:
            counts[e] = counts.get(e, 0) + 1
    often = {e for e, n in counts.items() if n >= 2}
    assert teacher.restrict([a for _, a in sample_answers], 2) == len(often)
    restricted = teacher.answer(messages)
    used = {e for answer in restricted for e in parse_message(answer).emoji}
    assert used <= often and len(used) > 8, used
    assert sum(a != b for a, (_, b) in zip(restricted, sample_answers, strict=True)) > 0
    assert all(parse_message(a).ok for a in restricted)
    with pytest.raises(ValueError, match="keeps 0 emoji"):
        teacher.restrict([a for _, a in sample_answers], 10_000)


class CountingEmbedder:
    """A tiny stand-in for MiniLM: a fixed random unit vector per text, and a count of texts embedded."""

    def __init__(self, salt: str = "") -> None:
        self.salt, self.embedded = salt, 0

    def encode(self, texts: list[str], **kwargs: object) -> torch.Tensor:
        self.embedded += len(texts)
        rows = []
        for text in texts:
            gen = torch.Generator().manual_seed(hash(self.salt + text) % 2**31)
            rows.append(torch.nn.functional.normalize(torch.randn(8, generator=gen), dim=0))
        return torch.stack(rows)


def test_name_embeddings_are_computed_once_per_model_and_cached(tmp_path):
    first = OfflineTeacher(CountingEmbedder(), cache_dir=tmp_path)
    again_embedder = CountingEmbedder()
    again = OfflineTeacher(again_embedder, cache_dir=tmp_path)
    assert again_embedder.embedded == 1  # the probe that identifies the model, nothing else
    assert torch.equal(again._name_vecs, first._name_vecs)
    files = sorted((tmp_path / "offline-teacher").iterdir())
    assert len(files) == 1 and files[0].suffix == ".pt"  # no temp file left behind
    other_model = CountingEmbedder(salt="another model")
    OfflineTeacher(other_model, cache_dir=tmp_path)
    assert other_model.embedded > 1
    assert len(list((tmp_path / "offline-teacher").iterdir())) == 2


def test_content_queries_are_content_words_and_adjacent_pairs():
    queries = [q.text for q in content_queries("Let's grab pizza and watch a scary movie tonight")]
    assert queries == [
        "grab",
        "grab pizza",
        "pizza",
        "watch",
        "scary",
        "scary movie",
        "movie",
        "movie tonight",
        "tonight",
    ]
    assert content_queries("I am so and it is") == []
