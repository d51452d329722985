"""The teacher that needs no API: a greedy max-entropy Wordle solver, and its games as reasoning text.

Each turn it plays, among the allowed words consistent with all the feedback so far (hard mode: the
consistency reward penalises anything else), the one whose feedback has the highest entropy over the
answers still possible (ties go to a word that could itself be the answer), and guesses outright once
one or two remain. All feedback comes from one pattern matrix (allowed words x answers, 30 MB of uint8), computed
once and cached under `models.cache_dir()`.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from emoji_rl.games.wordle.rules import (
    ALL_GREEN,
    Knowledge,
    Mark,
    WordLists,
    encode,
    feedback,
    pattern_code,
    pattern_matrix,
)
from emoji_rl.lm.models import cache_dir

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
    think: str
    """The reasoning an SFT trace shows: only what the board says, and that the guess fits it."""

    @property
    def reply(self) -> str:
        """The turn as a player answers it, in the game's strict format."""
        return f"<think>{self.think}</think><guess>{self.guess}</guess>"


class EntropySolver:
    """Greedy max-entropy play in hard mode: every guess is an allowed word (of 12,972) consistent with
    all the feedback so far, the one whose feedback splits the answers still possible best."""

    def __init__(self, words: WordLists) -> None:
        self.answers = words.answers
        self.guesses = tuple(sorted(words.allowed))
        self.matrix = cached_pattern_matrix(self.guesses, self.answers)
        self.is_answer = np.isin(np.array(self.guesses), np.array(self.answers))
        self._encoded_guesses = encode(self.guesses)
        self._answer_column = {a: i for i, a in enumerate(self.answers)}
        self._guess_row = {g: i for i, g in enumerate(self.guesses)}
        # The game tree is shared by all answers: the choice after a board is computed once.
        self._choices: dict[tuple[tuple[str, tuple[Mark, ...]], ...], int] = {}
        self._row_patterns: dict[int, np.ndarray] = {}

    def choose(
        self, board: list[tuple[str, tuple[Mark, ...]]], candidates: np.ndarray, playable: np.ndarray
    ) -> int:
        """Row of the best guess among the `playable` rows, for the candidate answer columns."""
        if len(candidates) <= 2:
            return self._guess_row[self.answers[candidates[0]]]
        key = tuple(board)
        if key not in self._choices:
            rows = np.flatnonzero(playable)
            bits = entropies(self.matrix[rows][:, candidates])
            # A possible answer can win outright: prefer it among (near-)equal splits.
            self._choices[key] = int(rows[np.argmax(bits + 1e-6 * self.is_answer[rows])])
        return self._choices[key]

    def play(self, answer: str, max_turns: int = 6) -> list[SolverTurn]:
        """The solver's game for `answer`, turn by turn (stops when solved or after `max_turns`)."""
        target = self._answer_column[answer]
        candidates = np.arange(len(self.answers))
        playable = np.ones(len(self.guesses), dtype=bool)
        board: list[tuple[str, tuple[Mark, ...]]] = []
        turns: list[SolverTurn] = []
        while len(turns) < max_turns:
            row = self.choose(board, candidates, playable)
            guess = self.guesses[row]
            marks = feedback(answer, guess)
            turns.append(SolverTurn(guess, marks, reasoning(Knowledge.from_board(board), guess)))
            if guess == answer:
                break
            board.append((guess, marks))
            candidates = candidates[self.matrix[row, candidates] == self.matrix[row, target]]
            # Hard mode: a later guess must reproduce this feedback as if it were the answer.
            playable &= self._patterns_against_guesses(row) == pattern_code(marks)
        return turns

    def _patterns_against_guesses(self, row: int) -> np.ndarray:
        """Feedback of guess `row` if each allowed word were the answer (a few hundred rows are ever played)."""
        if row not in self._row_patterns:
            self._row_patterns[row] = pattern_matrix(self._encoded_guesses[[row]], self._encoded_guesses)[0]
        return self._row_patterns[row]


def reasoning(knowledge: Knowledge, guess: str) -> str:
    """Short reasoning from the board alone: greens, yellows and absent letters, then that the guess
    fits them. No counts of words left and no bits: the model cannot compute those."""
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
    if parts:
        parts.append(f"{guess} fits all of this.")
    else:
        parts.append(f"No feedback yet: {guess} tries common letters.")
    return " ".join(p if p.endswith(".") else p + "." for p in parts)
