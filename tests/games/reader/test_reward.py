"""The reader's reward and its contrast term against numbers worked by hand, on an embedder whose
vectors are given; and the records the reader plays, read from an SFT split."""

import asyncio
import json

import pytest
import torch
from tests.games.scripted import ScriptedSampler, ScriptedSender

from emoji_rl.errors import DataError, UserError
from emoji_rl.games.reader.game import ReaderBuilder, ReaderRules
from emoji_rl.games.reader.partner import Partner
from emoji_rl.games.reader.records import read_reader_records
from emoji_rl.play.loop import play
from emoji_rl.play.reward import reader_reward
from emoji_rl.play.similarity import ContrastConfig, GuessScorer, Similarity

# Unit vectors in the plane: cosine similarities are worked out by hand.
VECTORS = {
    "pizza night": (1.0, 0.0),
    "the train is late": (0.0, 1.0),
    "my flight got cancelled": (0.6, 0.8),
    "We ate pizza": (0.8, 0.6),
    "Something happened": (0.6, 0.8),
}


class GivenEmbedder:
    """An embedder whose texts have the vectors above."""

    def get_embedding_dimension(self):
        return 2

    def encode(self, texts, **kwargs):
        return torch.tensor([VECTORS[t] for t in texts], dtype=torch.float64)


def test_the_reward_is_the_similarity_less_contrast_times_the_background():
    assert reader_reward(0.6, 0.25, 1.0) == pytest.approx(
        {"similarity": 0.6, "contrast": -0.25, "total": 0.35}
    )
    assert reader_reward(0.6, 0.25, 0.0)["total"] == pytest.approx(0.6)


@pytest.mark.parametrize(
    ("guess", "similarity", "background"),
    [
        # cos(pizza night) = 0.8; others: (0.6, 0.96), the target's own row left out of the sample
        ("We ate pizza", 0.8, (0.6 + 0.96) / 2),
        # a guess that fits other messages better than this one: 0.6 here, (0.8 + 1.0) / 2 there
        ("Something happened", 0.6, (0.8 + 1.0) / 2),
    ],
)
def test_the_contrast_term_charges_how_well_a_guess_fits_other_messages(
    smollm2_tokenizer, guess, similarity, background
):
    scorer = Similarity(GivenEmbedder())
    targets = ["pizza night", "the train is late", "my flight got cancelled"]
    contrast = ContrastConfig(contrast=1.0, contrast_messages=3).background(scorer, targets, seed=0)
    assert contrast is not None and sorted(contrast.messages) == sorted(targets)
    builder = ReaderBuilder(
        smollm2_tokenizer,
        Partner(ScriptedSender([])),
        GuessScorer(scorer, contrast),
        ReaderRules(max_turns=1, contrast=1.0),
    )
    record = {"target": "pizza night", "emoji": "🍕 🌃"}
    [episode] = asyncio.run(play([builder(record)], ScriptedSampler(smollm2_tokenizer, [guess])))
    metrics = episode.turns[0].result.metrics
    assert metrics["similarity"] == pytest.approx(similarity)
    assert metrics["background"] == pytest.approx(background)
    assert episode.reward == pytest.approx(similarity - background)
    assert ContrastConfig().background(scorer, targets, seed=0) is None  # off by default


def _split(tmp_path, *records):
    path = tmp_path / "sft_train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _sft(target, answer, **extra):
    messages = [{"role": "user", "content": f"Communicate this message using only emoji: {target}"}]
    return {"target": target, "messages": [*messages, {"role": "assistant", "content": answer}], **extra}


def test_records_come_from_an_sft_split_with_the_teachers_emoji_canonical(tmp_path):
    path = _split(tmp_path, _sft("pizza night", " 🍕 🌃\n", id="c0"), _sft("the train is late", "🚆 ⏰"))
    assert read_reader_records(path, 2, 8) == [
        {"id": "c0", "target": "pizza night", "emoji": "🍕 🌃"},
        {"target": "the train is late", "emoji": "🚆 ⏰"},
    ]


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"messages": [{"role": "assistant", "content": "🍕 🌃"}]}, "no non-empty string `target`"),
        ({"target": "pizza night", "messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        (_sft("pizza night", "pizza 🍕"), "not an emoji message"),
        (_sft("pizza night", "🍕"), "too few emoji"),
    ],
)
def test_a_bad_record_is_named_by_file_and_line(tmp_path, bad, reason):
    path = _split(tmp_path, _sft("pizza night", "🍕 🌃"), bad)
    with pytest.raises(DataError, match=reason) as err:
        read_reader_records(path, 2, 8)
    assert (err.value.path, err.value.line) == (path, 2)


def test_a_missing_split_says_what_makes_it(tmp_path):
    with pytest.raises(UserError, match="emoji-rl teacher"):
        read_reader_records(str(tmp_path / "missing.jsonl"), 2, 8)
