"""The teacher that needs no API: a greedy max-entropy Wordle solver, and its games as reasoning text.

Each turn it plays the allowed word whose feedback has the highest entropy over the answers still
possible (ties go to a word that could itself be the answer), and guesses outright once one or two
remain. All feedback comes from one pattern matrix (allowed words x answers, 30 MB of uint8), computed
once and cached under `models.cache_dir()`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from emoji_rl.models import cache_dir
from emoji_rl.rl.games.wordle_rules import (
    ALL_GREEN,
    Knowledge,
    Mark,
    WordLists,
    encode,
    feedback,
    pattern_matrix,
)

log = logging.getLogger(__name__)

N_PATTERNS = ALL_GREEN + 1


def cached_pattern_matrix(guesses: tuple[str, ...], answers: tuple[str, ...]) -> np.ndarray:
    """`pattern_matrix` of the two lists, read from the cache when the lists are the same."""
    key = hashlib.sha256(("\n".join(guesses) + "|" + "\n".join(answers)).encode()).hexdigest()[:16]
    path = cache_dir() / "wordle" / f"patterns-{len(guesses)}x{len(answers)}-{key}.npy"
    if path.is_file():
        return np.load(path)
    log.info("computing the Wordle pattern matrix (%d x %d), cached at %s", len(guesses), len(answers), path)
    matrix = pattern_matrix(encode(guesses), encode(answers))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{id(matrix)}.tmp.npy")
    np.save(tmp, matrix)
    tmp.replace(path)  # atomic: a concurrent reader sees no half-written file
    return matrix


def entropies(codes: np.ndarray) -> np.ndarray:
    """Entropy in bits of each row's pattern distribution (rows: guesses, columns: equally likely answers).

    Counts come from runs in each sorted row, so the work is n x m, not n x 243, when few answers remain."""
    n, m = codes.shape
    ordered = np.sort(codes, axis=1)
    starts = np.ones((n, m), dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    run = np.cumsum(starts, axis=1) - 1 + m * np.arange(n)[:, None]
    counts = np.bincount(run.ravel(), minlength=n * m).astype(np.float64)
    counts = counts[counts > 0]
    # H = log2(m) - (1/m) * sum over patterns of c * log2(c), summed per row
    row_of_run = np.repeat(np.arange(n), starts.sum(axis=1))
    return np.log2(m) - np.bincount(row_of_run, weights=counts * np.log2(counts), minlength=n) / m


@dataclass(frozen=True)
class SolverTurn:
    guess: str
    marks: tuple[Mark, ...]
    candidates_before: int
    bits: float
    """Expected information of the guess over the candidates before it."""
    think: str
    """The reasoning an SFT trace shows: the constraints used and why this guess."""


class EntropySolver:
    """Greedy max-entropy play over the answer list; guesses come from `allowed` (all 12,972 words)."""

    def __init__(self, words: WordLists) -> None:
        self.answers = words.answers
        self.guesses = tuple(sorted(words.allowed))
        self.matrix = cached_pattern_matrix(self.guesses, self.answers)
        self.is_answer = np.isin(np.array(self.guesses), np.array(self.answers))
        self._answer_column = {a: i for i, a in enumerate(self.answers)}
        self._guess_row = {g: i for i, g in enumerate(self.guesses)}
        # The game tree is shared by all answers: the choice for a candidate set is computed once.
        self._choices: dict[bytes, tuple[int, float]] = {}

    def choose(self, candidates: np.ndarray) -> tuple[int, float]:
        """(row of the best guess, its entropy in bits) for the candidate answer columns."""
        if len(candidates) <= 2:
            row = self._guess_row[self.answers[candidates[0]]]
            return row, float(entropies(self.matrix[[row]][:, candidates])[0])
        key = candidates.tobytes()
        if key in self._choices:
            return self._choices[key]
        bits = entropies(self.matrix[:, candidates])
        # A candidate guess can win outright: prefer it among (near-)equal splits.
        in_play = np.zeros(len(self.guesses), dtype=bool)
        in_play[[self._guess_row[self.answers[c]] for c in candidates]] = True
        row = int(np.argmax(bits + 1e-6 * in_play))
        self._choices[key] = (row, float(bits[row]))
        return self._choices[key]

    def play(self, answer: str, max_turns: int = 6) -> list[SolverTurn]:
        """The solver's game for `answer`, turn by turn (stops when solved or after `max_turns`)."""
        target = self._answer_column[answer]
        candidates = np.arange(len(self.answers))
        board: list[tuple[str, tuple[Mark, ...]]] = []
        turns: list[SolverTurn] = []
        while len(turns) < max_turns:
            row, bits = self.choose(candidates)
            guess = self.guesses[row]
            think = reasoning(Knowledge.from_board(board), len(candidates), guess, bits, self.is_answer[row])
            marks = feedback(answer, guess)
            turns.append(SolverTurn(guess, marks, len(candidates), bits, think))
            if guess == answer:
                break
            board.append((guess, marks))
            codes = self.matrix[row, candidates]
            candidates = candidates[codes == self.matrix[row, target]]
        return turns


def reasoning(knowledge: Knowledge, candidates: int, guess: str, bits: float, could_win: bool) -> str:
    """Short reasoning stating the constraints used: greens, yellows, absent letters, words left."""
    parts = []
    if knowledge.greens:
        parts.append(
            "Fixed: "
            + ", ".join(f"{c.upper()} is letter {i + 1}" for i, c in sorted(knowledge.greens.items()))
        )
    if knowledge.yellow_spots:
        by_letter: dict[str, list[int]] = {}
        for i, c in sorted(knowledge.yellow_spots):
            by_letter.setdefault(c, []).append(i + 1)
        parts.append(
            "In the word: "
            + ", ".join(
                f"{c.upper()} (not letter {'/'.join(map(str, s))})" for c, s in sorted(by_letter.items())
            )
        )
    if knowledge.absent:
        parts.append("Absent: " + " ".join(sorted(c.upper() for c in knowledge.absent)))
    if candidates == 1:
        parts.append(f"Only one word fits: {guess}.")
    elif candidates == 2:
        parts.append(f"Two words fit; {guess} is one of them.")
    else:
        fit = f"{candidates} words fit" if parts else "No feedback yet"
        kind = "a possible answer" if could_win else "not a possible answer, but"
        parts.append(f"{fit}; {guess} is {kind} that splits them best ({bits:.1f} bits).")
    return " ".join(p if p.endswith(".") else p + "." for p in parts)
