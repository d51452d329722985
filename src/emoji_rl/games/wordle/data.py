"""`emoji-rl wordle-data`: Wordle SFT traces from the entropy solver, and RL splits (docs/DESIGN.md §9).

The 2,315 answers are shuffled (seeded) and `eval_answers` of them are held out: they go only to
`wordle_rl_eval.jsonl`, never into SFT traces or RL training. For every training answer the solver
plays a game; each of its turns becomes one chat record that ends with the solver's reply,
`<think>what the board says</think><guess>word</guess>`, after exactly the prompts and board lines
the game shows, so SFT trains on the context GRPO samples from (`sft.data.encode_episode`):
    {"id": "wordle-above-t2", "answer": "above", "turn": 2, "messages": [system, user, assistant, user, assistant]}
RL records are {"id": "wordle-above", "answer": "above"}. `wordle_data_stats.json` holds the split
sizes and the solver's win rate and mean guesses (of won games) over all answers.

The solver plays hard mode (every guess consistent with all the feedback so far, as the consistency
reward asks) and its reasoning states only board facts (greens, yellows, absent letters) and that
the guess fits them, never counts of words left or bits, which the model cannot compute. Measured on
all 2,315 answers: wins 99.6% (2,306; it loses jaunt, jolly, mound, patch, swore, vaunt, waste, watch,
willy, hard mode's known traps) in 3.591 guesses on average; the unrestricted entropy solver it
replaces won 100% in 3.464 but played probe words (e.g. bundt after soare for above) that the consistency reward penalises. Lost games stay in the
SFT data: each of their guesses is still a consistent one.

    cpu: emoji-rl wordle-data
    gpu: emoji-rl wordle-data --output_dir data/wordle   (the same: the solver runs in ~1 min on a CPU)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from emoji_rl.games.wordle.game import MAX_TURNS, board_message, feedback_line, wordle_messages
from emoji_rl.games.wordle.rules import load_word_lists
from emoji_rl.games.wordle.solver import EntropySolver, SolverTurn
from emoji_rl.io.jsonl import Record, write_json, write_jsonl


@dataclass
class Config:
    """Wordle SFT traces (entropy solver) and RL answer splits."""

    output_dir: str = field(default="data/wordle", metadata={"help": "where the JSONL files go"})
    eval_answers: int = field(
        default=315, metadata={"help": "answers held out for eval-wordle (never trained on); 2000 remain"}
    )
    max_turns: int = field(default=MAX_TURNS, metadata={"help": "guesses per game"})
    seed: int = field(default=0, metadata={"help": "seed of the answer shuffle"})

    def __post_init__(self) -> None:
        if not 0 < self.eval_answers < 2315:
            raise ValueError(f"eval_answers={self.eval_answers} must be in 1..2314: both splits need answers")


def trace_records(answer: str, turns: list[SolverTurn], max_turns: int) -> list[Record]:
    """One SFT chat record per solver turn, each ending with that turn's reply."""
    messages = wordle_messages(max_turns)
    lines: list[str] = []
    records = []
    for t, turn in enumerate(turns, start=1):
        messages = [*messages, {"role": "assistant", "content": turn.reply}]
        records.append({"id": f"wordle-{answer}-t{t}", "answer": answer, "turn": t, "messages": messages})
        lines.append(feedback_line(turn.guess, turn.marks))
        messages = [*messages, board_message(lines, max_turns)]
    return records


def main(cfg: Config) -> None:
    words = load_word_lists()
    solver = EntropySolver(words)
    # The solver plays every answer (2,315; about a minute on 2 cores): a bar says how far it is.
    playing = tqdm(words.answers, desc="wordle-data: solver games", unit="game")
    games = {answer: solver.play(answer, cfg.max_turns) for answer in playing}
    won = [len(turns) for answer, turns in games.items() if turns[-1].guess == answer]
    answers = list(words.answers)
    random.Random(cfg.seed).shuffle(answers)
    held_out, train = sorted(answers[: cfg.eval_answers]), sorted(answers[cfg.eval_answers :])
    out = Path(cfg.output_dir)
    sft = [r for answer in train for r in trace_records(answer, games[answer], cfg.max_turns)]
    write_jsonl(out / "wordle_sft_train.jsonl", sft)
    write_jsonl(out / "wordle_rl_train.jsonl", [{"id": f"wordle-{a}", "answer": a} for a in train])
    write_jsonl(out / "wordle_rl_eval.jsonl", [{"id": f"wordle-{a}", "answer": a} for a in held_out])
    stats = {
        "answers": len(answers),
        "train_answers": len(train),
        "eval_answers": len(held_out),
        "sft_records": len(sft),
        "solver_win_rate": len(won) / len(answers),
        "solver_mean_guesses": sum(won) / max(len(won), 1),
        "solver_first_guess": games[answers[0]][0].guess,
    }
    write_json(out / "wordle_data_stats.json", stats)
    print(
        f"wordle-data: solver wins {stats['solver_win_rate']:.1%} in {stats['solver_mean_guesses']:.3f} "
        f"guesses on average; {len(sft)} SFT records from {len(train)} answers, {len(held_out)} held out, in {out}"
    )
