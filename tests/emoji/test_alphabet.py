"""The parser and the grammar accept exactly the same strings (issue 2, item 3).

`grammar_accepts` runs xgrammar's matcher over the text's bytes (a 256-single-byte vocabulary) and
then end of turn, so these tests compare `parse_message` with the decoder's real automaton.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from emoji_rl.emoji.alphabet import ALPHABET, MAX_EMOJI, MIN_EMOJI, parse_message, random_answers
from emoji_rl.emoji.constraint import grammar_accepts

_ALPHABET_SET = frozenset(ALPHABET)
_WITH_FE0F = [e for e in ALPHABET if "\ufe0f" in e]
# Pieces that must never pass on their own: ASCII, keycaps, lone modifiers and joiners, text-default
# symbols the alphabet drops, a lone regional indicator, a tag character, an accented letter.
NEAR_MISS_PIECES = [
    *"aZ1#*.é",
    "1️⃣",
    "#️⃣",
    "\U0001f3fb",  # skin tone modifier alone
    "\u200d",  # ZWJ alone
    "\ufe0f",  # variation selector alone
    "\u20e3",  # combining keycap alone
    "©️",
    "™️",
    "‼️",
    "↔️",
    "Ⓜ️",
    "🅰️",
    "\U0001f1e6",  # regional indicator A alone
    "\U000e0067",  # tag letter g
    "\n",
]
messages = st.lists(st.sampled_from(ALPHABET), min_size=MIN_EMOJI, max_size=MAX_EMOJI)
separators = st.sampled_from(["", " "])


@st.composite
def valid_messages(draw: st.DrawFn) -> str:
    emoji = draw(messages)
    return emoji[0] + "".join(draw(separators) + e for e in emoji[1:])


@st.composite
def piece_soups(draw: st.DrawFn) -> str:
    """0-10 pieces (emoji, foreign pieces, emoji with FE0F dropped), 0-2 spaces between and around."""
    piece = st.one_of(
        st.sampled_from(ALPHABET),
        st.sampled_from(NEAR_MISS_PIECES),
        st.sampled_from(_WITH_FE0F).map(lambda e: e.replace("\ufe0f", "", 1)),
    )
    pieces = draw(st.lists(piece, min_size=0, max_size=MAX_EMOJI + 2))
    spacing = st.sampled_from(["", " ", "  "])
    text = "".join((draw(spacing) if i else "") + p for i, p in enumerate(pieces))
    return draw(st.sampled_from(["", " "])) + text + draw(st.sampled_from(["", " "]))


@st.composite
def near_misses(draw: st.DrawFn) -> str:
    """A valid message or a piece soup, then 0-2 edits anywhere, even inside an emoji: a character
    dropped (a FE0F, a ZWJ, a skin tone...) or a foreign piece or a space inserted."""
    text = draw(st.one_of(valid_messages(), piece_soups()))
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, len(text)))
        if draw(st.booleans()) and at < len(text):
            text = text[:at] + text[at + 1 :]
        else:
            text = text[:at] + draw(st.sampled_from([*NEAR_MISS_PIECES, " "])) + text[at:]
    return text


@given(st.text())
@settings(max_examples=500, deadline=None)
def test_arbitrary_text_never_crashes_the_parser_and_the_grammar_agrees(text: str) -> None:
    assert parse_message(text).ok == grammar_accepts(text)


@given(valid_messages())
@settings(max_examples=500, deadline=None)
def test_valid_messages_parse_and_the_grammar_accepts_them(text: str) -> None:
    result = parse_message(text)
    assert result.ok, result.reason
    assert "".join(result.emoji) == text.replace(" ", "")
    assert grammar_accepts(text)


@given(near_misses())
@settings(max_examples=1500, deadline=None)
def test_parser_and_grammar_agree_on_near_misses(text: str) -> None:
    result = parse_message(text)
    event(f"valid={result.ok}")  # --hypothesis-show-statistics shows the mix of valid and invalid
    assert result.ok == grammar_accepts(text), result.reason


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("🍕 🎉", True),
        ("🍕🎉", True),
        ("👍🏻👍", True),
        ("👨‍👩‍👧‍👦 🏳️‍🌈", True),
        ("🇯🇵🇫🇷", True),
        (" 🍕🎉", False),
        ("🍕🎉 ", False),
        ("🍕  🎉", False),
        ("🍕a🎉", False),
        ("🍕1️⃣", False),
        ("🍕🏻", False),
        ("🍕\u200d🎉", False),
        ("❤🎉", False),
        ("©️🎉", False),
        ("🍕", False),
        ("🍕" * 8, True),
        ("🍕" * 9, False),
        ("", False),
    ],
)
def test_parser_and_grammar_on_hand_picked_cases(text: str, ok: bool) -> None:
    assert parse_message(text).ok is ok
    assert grammar_accepts(text) is ok


def test_every_alphabet_emoji_is_accepted_alone_and_spaced() -> None:
    rejected = [e for e in ALPHABET if not (grammar_accepts(e + e) and grammar_accepts(f"{e} {e}"))]
    assert rejected == []


@pytest.mark.parametrize(("low", "high"), [(1, 1), (1, 3), (2, 4)])
def test_bounds_are_shared_by_parser_and_grammar(low: int, high: int) -> None:
    for n in range(0, high + 2):
        text = " ".join(["🍕"] * n)
        assert parse_message(text, low, high).ok == grammar_accepts(text, low, high) == (low <= n <= high)


@functools.cache
def _splits(text: str) -> bool:
    return text == "" or any(text[:i] in _ALPHABET_SET and _splits(text[i:]) for i in range(1, len(text) + 1))


def test_no_alphabet_entry_is_a_concatenation_of_others() -> None:
    # The parser's longest match is then the only split, so it counts emoji as the grammar does.
    concatenations = [
        e for e in ALPHABET if any(e[:i] in _ALPHABET_SET and _splits(e[i:]) for i in range(1, len(e)))
    ]
    assert concatenations == []


def test_parse_reasons_name_the_fault() -> None:
    assert parse_message("🍕a").reason == "non-emoji character 'a' (U+0061) at position 1"
    assert parse_message("🍕").reason == "too few emoji: 1 < 2"
    assert parse_message("🍕" * 9).reason == "too many emoji: 9 > 8"
    assert parse_message("🍕 ").reason == "trailing space at position 1"


def test_random_answers_are_valid_seeded_and_of_the_asked_lengths():
    lengths = [2, 3, 8, 5]
    answers = random_answers(lengths, seed=1)
    assert [len(parse_message(a).emoji) for a in answers] == lengths
    assert all(parse_message(a).ok for a in answers)
    assert random_answers(lengths, seed=1) == answers != random_answers(lengths, seed=2)
