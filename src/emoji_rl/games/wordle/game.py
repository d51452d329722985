"""Wordle (docs/DESIGN.md §9; seeds 003 and 004): the model guesses a secret five-letter word in at most six
guesses, answering `<think>…</think><guess>word</guess>`; after each guess it sees the whole board so
far, one line per guess (`Guess 2: crane -> C(x) R(-) A(✓) N(x) E(x)`). A reply with no readable
guess, or a word not in the list, is answered with the reason and still costs a turn. The reward is
terminal (`wordle_reward`), its terms logged as `reward/<term>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from emoji_rl.errors import UserError
from emoji_rl.games.wordle.reward import CurriculumTracker, TurnScore, WordleWeights, episode_terms
from emoji_rl.games.wordle.rules import (
    SYMBOLS,
    WORD_LENGTH,
    Knowledge,
    Mark,
    WordLists,
    consistent,
    encode,
    feedback,
    feedback_use,
    information_fraction,
    load_word_lists,
    parse_reply,
    pattern_code,
    pattern_matrix,
    render_marks,
)
from emoji_rl.play.chat import ChatEnv
from emoji_rl.play.types import StepResult

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

MAX_TURNS = 6
SYSTEM_PROMPT = (
    "You are playing Wordle. Find the secret {n}-letter English word in at most {turns} guesses. "
    "After each guess you get feedback on every letter: {green} = right letter in the right spot, "
    "{yellow} = the letter is in the word but in another spot, {gray} = the letter is not in the word "
    "(a repeated letter is marked {yellow} only as often as the word holds extra copies). "
    "Every guess must be a real {n}-letter word. Answer in exactly this format and nothing else:\n"
    "<think>short reasoning about what the feedback allows</think><guess>word</guess>"
)
FIRST_TURN = "Make your first guess."
NEXT_TURN = "Feedback so far:\n{board}\nYou have {left} guesses left. Make your next guess."


def wordle_messages(max_turns: int = MAX_TURNS) -> list[dict[str, str]]:
    """The chat a player sees on turn 1 (shared with the SFT traces)."""
    system = SYSTEM_PROMPT.format(
        n=WORD_LENGTH,
        turns=max_turns,
        green=SYMBOLS[Mark.GREEN],
        yellow=SYMBOLS[Mark.YELLOW],
        gray=SYMBOLS[Mark.GRAY],
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": FIRST_TURN}]


def board_message(lines: list[str], max_turns: int = MAX_TURNS) -> dict[str, str]:
    """The user turn after guess len(lines): every feedback line so far."""
    board = "\n".join(f"Guess {i}: {line}" for i, line in enumerate(lines, start=1))
    return {"role": "user", "content": NEXT_TURN.format(board=board, left=max_turns - len(lines))}


def feedback_line(guess: str, marks: tuple[Mark, ...]) -> str:
    """One board line after `Guess N: `, as the game and the SFT traces write it."""
    return f"{guess} -> {render_marks(guess, marks)}"


@dataclass(frozen=True)
class WordleRules:
    """The game's settings, the same for every episode of a run."""

    max_turns: int = MAX_TURNS
    weights: WordleWeights = field(default_factory=WordleWeights)


class WordleEnv(ChatEnv):
    """One episode for one secret word. Word lists and the encoded answer list are shared."""

    def __init__(
        self,
        answer: str,
        tokenizer: PreTrainedTokenizerBase,
        words: WordLists,
        answers_array: np.ndarray,
        rules: WordleRules,
        tracker: CurriculumTracker | None = None,
    ) -> None:
        super().__init__(tokenizer, wordle_messages(rules.max_turns))
        self.answer = answer
        self.words = words
        self.answers_array = answers_array
        self.rules = rules
        # Weights are fixed when the game is built, so the G games of a group are scored alike.
        self.phase = tracker.phase if tracker is not None else 0
        self.weights = tracker.weights if tracker is not None else rules.weights
        self.board: list[tuple[str, tuple[Mark, ...]]] = []
        self.lines: list[str] = []
        self.scores: list[TurnScore] = []
        self.candidates = np.arange(len(answers_array))

    async def step(self, action_ids: tuple[int, ...]) -> StepResult:
        # 1. parse: the reply up to its end-of-turn token; a cut-off reply is never strict
        text, ended = self.read(action_ids)
        guess, strict, reason = parse_reply(text)
        strict = strict and ended
        if guess is not None and guess not in self.words.allowed:
            reason = f"{guess!r} is not in the word list"
        valid = guess is not None and guess in self.words.allowed
        # 2. score the turn against what the board allowed before it
        codes = pattern_matrix(encode([guess]), self.answers_array[self.candidates])[0] if valid else None
        self.scores.append(self._score(guess, valid, strict, codes))
        # 3. feedback, and the board grows; an invalid guess costs the turn and teaches nothing
        if guess is not None and codes is not None:
            marks = feedback(self.answer, guess)
            self.candidates = self.candidates[codes == pattern_code(marks)]
            self.board.append((guess, marks))
            line = feedback_line(guess, marks)
            if reason:
                line += f" ({reason})"
        else:
            line = f"{(guess or text.strip()[:20]) or '(empty)'} -> invalid: {reason}"
        self.lines.append(line)
        log = {"reply": text, "guess": guess or "", "feedback": line}
        solved = guess == self.answer
        if solved or len(self.scores) == self.rules.max_turns:
            return self._finish(solved, log)
        # 4. the next user turn shows the whole board (continuation_ids closes a cut-off reply)
        observation = self.reply(text, action_ids, board_message(self.lines, self.rules.max_turns))
        metrics = {"candidates": float(len(self.candidates))}
        return StepResult(False, 0.0, observation, metrics, log)

    def _score(self, guess: str | None, valid: bool, strict: bool, codes: np.ndarray | None) -> TurnScore:
        if guess is None:
            return TurnScore(None, strict, False, False, None, 0.0, False)
        return TurnScore(
            guess=guess,
            strict_format=strict,
            five_letters=True,
            consistent=valid and consistent(guess, self.board),
            feedback_use=feedback_use(guess, Knowledge.from_board(self.board)) if self.board else None,
            info=information_fraction(codes) if codes is not None else 0.0,
            repeated=any(guess == past for past, _ in self.board),
        )

    def _finish(self, solved: bool, log: dict[str, str]) -> StepResult:
        terms = episode_terms(self.scores, solved, self.weights)
        n = len(self.scores)
        format_share = sum(s.strict_format for s in self.scores) / n
        metrics = {
            "won": float(solved),
            "turns": float(n),
            "format_rate": format_share,
            # guesses that fit all the feedback before them (a first guess fits an empty board)
            "consistent_rate": sum(s.consistent for s in self.scores) / n,
            "invalid_rate": sum(s.guess is None or s.guess not in self.words.allowed for s in self.scores)
            / n,
            "repeat_rate": sum(s.repeated for s in self.scores) / n,
            "curriculum_phase": float(self.phase),
            **{f"reward/{name}": value for name, value in terms.items()},
        }
        return StepResult(True, terms["total"], metrics=metrics, log={**log, "answer": self.answer})


class WordleBuilder:
    """Builds one game per record `{"answer": word}`; the word lists load once and are shared. With a
    `tracker`, new games take the curriculum's current weights; the trainer feeds it each step's
    finished episodes (`GameSetup.observe`), every process's."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, rules: WordleRules, tracker: CurriculumTracker | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.rules = rules
        self.tracker = tracker
        self.words = load_word_lists()
        self.answers_array = encode(self.words.answers)

    def __call__(self, record: dict[str, str]) -> WordleEnv:
        answer = str(record.get("answer", "")).lower()
        if answer not in self.words.answers:
            raise UserError(
                f"record {record!r}: `answer` must be one of the {len(self.words.answers)} answers"
            )
        return WordleEnv(answer, self.tokenizer, self.words, self.answers_array, self.rules, self.tracker)
