"""The rounds of the browser game, apart from HTTP: who plays which target with which sender, the
turns, and the checks on what a person typed (the models run as jobs: `web/jobs.py`, `web/runners.py`).

Guess mode is the human evaluation: a sender (assigned blind, the one with the fewest rounds so far,
then its least-played target) writes emoji for a hidden target; the person guesses; the guess is
scored with the training scorer (`play/reward.py`), and the model judge's guess of the same
emoji is shown beside it. A guess below tau may ask the sender for another turn: the sender sees the
person's guess as the correction prompt, as it sees the judge's in the game. Send mode swaps the
roles: the person writes emoji (checked by the models' parser), the model judge guesses. It shows
its target, so it plays targets of its own (`for_send`), never one that guess mode hides.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import threading
from collections.abc import Callable, Sequence

from emoji_rl.data.dedup import normalize
from emoji_rl.emoji.alphabet import parse_message
from emoji_rl.emoji.sender_prompts import correction_message, sender_messages
from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import Record
from emoji_rl.lm.adapters import adapter_hash
from emoji_rl.play.guessing import JudgeInput
from emoji_rl.web.jobs import BadInput, Jobs
from emoji_rl.web.runners import Models
from emoji_rl.web.store import (
    SCORED_COLUMNS,
    AnswerRejected,
    Round,
    StaleAnswer,
    Store,
    Turn,
    judge_scores_by_sender,
)

MAX_TEXT_CHARS = 300
MAX_PLAYER_CHARS = 40
TURN_LIMIT = 100  # turns a round may have: keeps what a page sends as a turn within SQLite's integers
ANONYMOUS = "anonymous"
# Of 256 hash buckets, those whose targets are for send mode: a quarter. Guess mode, the human
# evaluation, keeps the rest, and needs more rounds per target than send mode.
SEND_BUCKETS = 64


def clean_text(text: object, what: str, limit: int = MAX_TEXT_CHARS) -> str:
    if not isinstance(text, str):
        raise BadInput(f"{what} must be text")
    text = " ".join(text.split())
    if not text:
        raise BadInput(f"{what} is empty: type something first")
    if len(text) > limit:
        raise BadInput(f"{what} is too long: {len(text)} characters, at most {limit}")
    return text


def clean_player(name: object) -> str:
    if name in (None, ""):
        return ANONYMOUS
    return clean_text(name, "your name", MAX_PLAYER_CHARS)


def target_ids(records: Sequence[Record], source: str) -> list[tuple[str, str]]:
    """(id, target) per record: the record's `id`, else `source:line` so rows still say which one."""
    return [(str(r.get("id") or f"{source}:{i}"), r["target"]) for i, r in enumerate(records, start=1)]


def for_send(target: str) -> bool:
    """Whether people write emoji for `target` (send mode) rather than guess it: send mode shows its
    target, so a target shown there must never be one a person guesses. By a hash of the normalized
    text: no seed nor order, a target keeps its mode when the file grows, and two copies of one
    message cannot fall one in each mode."""
    return hashlib.sha256(normalize(target).encode()).digest()[0] < SEND_BUCKETS


def split_targets(targets: Sequence[tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """(guess mode's, send mode's) targets, by id, disjoint (`for_send`)."""
    guess = {i: t for i, t in targets if not for_send(t)}
    send = {i: t for i, t in targets if for_send(t)}
    if not guess or not send:
        raise UserError(
            f"play-web needs targets for both modes: of {len(targets)} target messages (data), "
            f"{len(send)} fall to send mode (about a quarter do, by a hash of the text); give it more"
        )
    return guess, send


class Rounds:
    """Every round of both modes, over the answer store: started, answered turn by turn, scored, and
    the leaderboard. (`play.types.Env` is the RL game; this is what a browser page plays.)"""

    def __init__(
        self,
        store: Store,
        models: Models,
        senders: dict[str, str | None],
        targets: Sequence[tuple[str, str]],
        *,
        max_turns: int,
        tau: float,
        seed: int = 0,
    ) -> None:
        if not senders:
            raise UserError("play-web needs at least one sender (systems: base or NAME=ADAPTER_DIR)")
        self.store, self.models, self.senders = store, models, senders
        self.hashes = {name: adapter_hash(path) for name, path in senders.items()}
        self.targets, self.send_targets = split_targets(targets)
        self.max_turns, self.tau = max_turns, tau
        self.jobs = Jobs()
        self._rng = random.Random(seed)
        self._seeds = itertools.count(seed)
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, int], str] = {}  # (round, turn) being written or judged -> job

    # --- assignment ----------------------------------------------------------------------------

    def _least(self, counts: dict[str, int], keys: Sequence[str]) -> str:
        fewest = min(counts.get(k, 0) for k in keys)
        return self._rng.choice([k for k in keys if counts.get(k, 0) == fewest])

    def _new_round(self, mode: str, player: str) -> Round:
        with self._lock:  # two players starting at once must not both see the same counts
            if mode == "guess":
                sender = self._least(self.store.rounds_per_sender("guess"), list(self.senders))
                adapter, digest = self.senders[sender], self.hashes[sender]
            else:
                sender, adapter, digest = "person", None, None
            targets = self.targets if mode == "guess" else self.send_targets
            target_id = self._least(
                self.store.rounds_per_target(mode, sender if mode == "guess" else None), list(targets)
            )
            return self.store.new_round(
                mode=mode,
                player=player,
                sender=sender,
                adapter=adapter,
                adapter_hash=digest,
                target_id=target_id,
                target=targets[target_id],
                max_turns=self.max_turns if mode == "guess" else 1,
            )

    def _once(
        self,
        key: tuple[str, int],
        work: Callable[[], Record],
        done: Callable[[], Record | None] = lambda: None,
    ) -> str:
        """One job per (round, turn): a second request while it runs gets the same job back, and
        one after it ran a finished job with `done()`'s record, if that is not None. Both checks and
        the submit hold the lock a job holds to leave `_pending`, so a repeat never runs it twice."""
        with self._lock:
            if key in self._pending:
                return self._pending[key]
            if (result := done()) is not None:
                return self.jobs.done(result)

            def run() -> Record:
                try:
                    return work()
                finally:
                    with self._lock:
                        self._pending.pop(key, None)

            self._pending[key] = job = self.jobs.submit(run)
            return job

    # --- guess mode ------------------------------------------------------------------------------

    def start_guess(self, player: object) -> str:
        round_ = self._new_round("guess", clean_player(player))
        return self._once((round_.round_id, 1), lambda: self._write_turn(round_, 1, []))

    def _write_turn(self, round_: Round, turn: int, human_guesses: Sequence[str]) -> Record:
        previous = self.store.turns(round_.round_id)
        conversation = sender_messages(round_.target)
        for t, guess in zip(previous, human_guesses, strict=True):
            conversation += [
                {"role": "assistant", "content": t.emoji},
                correction_message(guess, round_.target),
            ]
        emoji = self.models.write(round_.sender, conversation, next(self._seeds))
        turns = (*(parse_message(t.emoji).emoji for t in previous), parse_message(emoji).emoji)
        judged = self.models.judge(JudgeInput(turns, tuple(t.judge_guess for t in previous)))
        score = self.models.similarity(round_.target, judged.text)
        self.store.add_turn(round_.round_id, Turn(turn, emoji, judged.text, score))
        return _shown(round_, turn, emoji)

    def answer_guess(self, round_id: object, turn: object, text: object) -> Record:
        text = clean_text(text, "your guess")
        round_id, turn = _round_ref(round_id, turn)
        round_ = self.store.check_open(round_id, turn)
        if round_.mode != "guess":
            raise AnswerRejected("this round is a send-mode round: answer it with emoji")
        served = self.store.turns(round_id)[-1]
        similarity = self.models.similarity(round_.target, text)
        row = self.store.add_answer(
            round_id,
            turn,
            emoji=served.emoji,
            text=text,
            similarity=similarity,
            judge_guess=served.judge_guess,
            judge_similarity=served.judge_similarity,
        )
        return {
            "turn": turn,
            "guess": text,
            "target": round_.target,
            "similarity": similarity,
            "judge_guess": served.judge_guess,
            "judge_similarity": served.judge_similarity,
            "can_continue": similarity < self.tau and turn < round_.max_turns,
            "answer_id": row["id"],
        }

    def next_turn(self, round_id: object, turn: object) -> str:
        """Ask the sender for turn `turn` + 1, after the person's guess of `turn` fell short. A repeat
        (a double click, a retry) gets the same turn, whether it is still being written or not."""
        round_id, turn = _round_ref(round_id, turn)
        round_ = self.store.round(round_id)
        if round_ is None or round_.mode != "guess":
            raise StaleAnswer("this page is out of date: the server does not know its round; start a new one")
        answers = self.store.answers("guess", round_id)
        if len(answers) != turn:
            raise StaleAnswer(
                f"this page is out of date: it asks for turn {turn + 1}, the round has {len(answers)} "
                "answered turns; reload, or start a new round"
            )
        if turn >= round_.max_turns or answers[-1]["similarity"] >= self.tau:
            raise AnswerRejected("this round is over: start a new one")
        guesses = [a["text"] for a in answers]

        def written() -> Record | None:
            served = self.store.turns(round_id)
            return _shown(round_, turn + 1, served[turn].emoji) if len(served) > turn else None

        return self._once(
            (round_id, turn + 1), lambda: self._write_turn(round_, turn + 1, guesses), done=written
        )

    # --- send mode -------------------------------------------------------------------------------

    def start_send(self, player: object) -> Record:
        round_ = self._new_round("send", clean_player(player))
        return {"round_id": round_.round_id, "turn": 1, "target": round_.target}

    def answer_send(self, round_id: object, emoji: object) -> str:
        if not isinstance(emoji, str):
            raise BadInput("your emoji must be text")
        parsed = parse_message(emoji.strip())
        if not parsed.ok:
            raise BadInput(f"not an emoji message the models could send: {parsed.reason}")
        round_id, _ = _round_ref(round_id, 1)
        round_ = self.store.check_open(round_id, 1)
        if round_.mode != "send":
            raise AnswerRejected("this round is a guess-mode round: answer it with a guess")
        text = emoji.strip()

        def judge() -> Record:
            guess = self.models.judge(JudgeInput((parsed.emoji,)))
            score = self.models.similarity(round_.target, guess.text)
            self.store.add_answer(
                round_id,
                1,
                emoji=text,
                text=text,
                similarity=score,
                judge_guess=guess.text,
                judge_similarity=score,
            )
            return {"target": round_.target, "emoji": text, "judge_guess": guess.text, "similarity": score}

        return self._once((round_id, 1), judge)

    def leaderboard(self) -> list[Record]:
        """Mean judge similarity of each sender's first turns: people (send mode) beside the models."""
        rows = [
            {"kind": kind, "name": name, "score": sum(v) / len(v), "rounds": len(v)}
            for (kind, name), v in judge_scores_by_sender(self.store.answers(columns=SCORED_COLUMNS)).items()
        ]
        return sorted(rows, key=lambda r: -r["score"])

    def close(self) -> None:
        """Stop: the model call in flight is cut short, queued ones dropped, then the store closes."""
        self.models.stop()
        self.jobs.close()
        self.store.close()


def _shown(round_: Round, turn: int, emoji: str) -> Record:
    """A sender's turn as the page shows it: never the sender's name nor the target."""
    return {"round_id": round_.round_id, "turn": turn, "max_turns": round_.max_turns, "emoji": emoji}


def _round_ref(round_id: object, turn: object) -> tuple[str, int]:
    if not isinstance(round_id, str) or not round_id:
        raise BadInput("the page sent no round id: reload it")
    if not isinstance(turn, int) or isinstance(turn, bool) or not 1 <= turn <= TURN_LIMIT:
        raise BadInput(f"the page sent a bad turn {str(turn)[:40]!r} (1 to {TURN_LIMIT}): reload it")
    return round_id, turn
