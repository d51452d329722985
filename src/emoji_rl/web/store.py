"""What people played, in SQLite: the rounds served, the turns each sender wrote, one row per answer.

Crash safety: WAL with `synchronous=FULL`, so each answer's commit is fsynced to the log before the
request that made it returns; a killed server loses nothing it already answered. One answer per
(round, turn) is a UNIQUE key, and an answer is checked against the round's current turn inside the
same `BEGIN IMMEDIATE` transaction that inserts it: a double submit or a stale page is a clear error,
never a second row nor half of one. Every query is parameterised.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from emoji_rl.errors import UserError
from emoji_rl.io.jsonl import Record, write_jsonl

Mode = Literal["guess", "send"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rounds (
    round_id     TEXT PRIMARY KEY,
    mode         TEXT NOT NULL CHECK (mode IN ('guess', 'send')),
    player       TEXT NOT NULL,
    sender       TEXT NOT NULL,
    adapter      TEXT,
    adapter_hash TEXT,
    target_id    TEXT NOT NULL,
    target       TEXT NOT NULL,
    max_turns    INTEGER NOT NULL,
    created_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS turns (
    round_id         TEXT NOT NULL REFERENCES rounds (round_id),
    turn             INTEGER NOT NULL,
    emoji            TEXT NOT NULL,
    judge_guess      TEXT NOT NULL,
    judge_similarity REAL NOT NULL,
    PRIMARY KEY (round_id, turn)
);
CREATE TABLE IF NOT EXISTS answers (
    id               INTEGER PRIMARY KEY,
    round_id         TEXT NOT NULL REFERENCES rounds (round_id),
    turn             INTEGER NOT NULL,
    mode             TEXT NOT NULL,
    player           TEXT NOT NULL,
    sender           TEXT NOT NULL,
    adapter          TEXT,
    adapter_hash     TEXT,
    target_id        TEXT NOT NULL,
    target           TEXT NOT NULL,
    emoji            TEXT NOT NULL,
    text             TEXT NOT NULL,
    similarity       REAL NOT NULL,
    judge_guess      TEXT NOT NULL,
    judge_similarity REAL NOT NULL,
    answered_at      REAL NOT NULL,
    UNIQUE (round_id, turn)
);
"""

# The columns of an answer row, in the order of the table and of the JSONL export.
ANSWER_COLUMNS = (
    "id",
    "round_id",
    "turn",
    "mode",
    "player",
    "sender",
    "adapter",
    "adapter_hash",
    "target_id",
    "target",
    "emoji",
    "text",
    "similarity",
    "judge_guess",
    "judge_similarity",
    "answered_at",
)


SCORED_COLUMNS = ("turn", "mode", "player", "sender", "judge_similarity")  # what the function below reads


def judge_scores_by_sender(answers: Iterable[Record]) -> dict[tuple[str, str], list[float]]:
    """The model judge's similarity on each sender's first turns, by (kind, name): people by name
    (send mode: they wrote the emoji) as ("person", player), models as ("model", sender) (guess mode's
    answered rounds). The leaderboard's numbers, and eval-human's send-mode table."""
    scores: dict[tuple[str, str], list[float]] = {}
    for a in answers:
        if a["turn"] == 1:
            who = ("person", a["player"]) if a["mode"] == "send" else ("model", a["sender"])
            scores.setdefault(who, []).append(a["judge_similarity"])
    return scores


class AnswerRejected(UserError):
    """An answer the store refused; `message` is shown to the person as it is."""


class DuplicateAnswer(AnswerRejected):
    """This (round, turn) was answered already: a double submit."""


class StaleAnswer(AnswerRejected):
    """The page answers a round or turn that is not the one being played (an old tab, a restart)."""


@dataclass(frozen=True)
class Round:
    round_id: str
    mode: Mode
    player: str
    sender: str
    adapter: str | None
    adapter_hash: str | None
    target_id: str
    target: str
    max_turns: int


@dataclass(frozen=True)
class Turn:
    turn: int
    emoji: str
    judge_guess: str
    judge_similarity: float


class Store:
    """One SQLite file; safe to share between the server's threads (one connection, one lock: SQLite
    serialises writers anyway, and an answer is a few hundred bytes)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
            self._db.row_factory = sqlite3.Row
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
        except sqlite3.DatabaseError as err:
            raise UserError(
                f"answer store {self.path}: {err} (is it an emoji-rl play-web database?)"
            ) from err
        if mode.lower() != "wal":
            raise UserError(
                f"answer store {self.path}: SQLite refused WAL mode (got {mode}); use a local disk"
            )
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, statements: list[tuple[str, tuple]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def new_round(
        self,
        *,
        mode: Mode,
        player: str,
        sender: str,
        adapter: str | None,
        adapter_hash: str | None,
        target_id: str,
        target: str,
        max_turns: int,
    ) -> Round:
        round_ = Round(
            uuid.uuid4().hex, mode, player, sender, adapter, adapter_hash, target_id, target, max_turns
        )
        self._write(
            [
                (
                    "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (*vars(round_).values(), time.time()),
                )
            ]
        )
        return round_

    def add_turn(self, round_id: str, turn: Turn) -> None:
        """A turn the sender wrote (and the model judge's guess of it), before anyone answers it."""
        self._write(
            [
                (
                    "INSERT INTO turns VALUES (?, ?, ?, ?, ?)",
                    (round_id, turn.turn, turn.emoji, turn.judge_guess, turn.judge_similarity),
                )
            ]
        )

    def round(self, round_id: str) -> Round | None:
        with self._lock:
            return self._round(round_id)

    def _round(self, round_id: str) -> Round | None:
        row = self._db.execute(
            "SELECT round_id, mode, player, sender, adapter, adapter_hash, target_id, target, max_turns "
            "FROM rounds WHERE round_id = ?",
            (round_id,),
        ).fetchone()
        return Round(**dict(row)) if row else None

    def turns(self, round_id: str) -> list[Turn]:
        with self._lock:
            rows = self._db.execute(
                "SELECT turn, emoji, judge_guess, judge_similarity FROM turns WHERE round_id = ? ORDER BY turn",
                (round_id,),
            ).fetchall()
        return [Turn(**dict(r)) for r in rows]

    def check_open(self, round_id: str, turn: int) -> Round:
        """The round, if (round, turn) may still be answered; else why not, as an AnswerRejected."""
        with self._lock:
            return self._check_open(round_id, turn)

    def _check_open(self, round_id: str, turn: int) -> Round:
        round_ = self._round(round_id)
        if round_ is None:
            raise StaleAnswer("this page is out of date: the server does not know its round; start a new one")
        answered = self._db.execute(
            "SELECT 1 FROM answers WHERE round_id = ? AND turn = ?", (round_id, turn)
        ).fetchone()
        if answered:
            raise DuplicateAnswer(f"turn {turn} of this round is answered already (submitted twice?)")
        served = self._db.execute("SELECT MAX(turn) FROM turns WHERE round_id = ?", (round_id,)).fetchone()[0]
        latest = served if round_.mode == "guess" else 1
        if latest is None:
            raise StaleAnswer(f"turn {turn} of this round has not been written yet: wait for the sender")
        if turn != latest:
            raise StaleAnswer(
                f"this page is out of date: it answers turn {turn}, the round is at turn {latest}; reload"
            )
        return round_

    def add_answer(
        self,
        round_id: str,
        turn: int,
        *,
        emoji: str,
        text: str,
        similarity: float,
        judge_guess: str,
        judge_similarity: float,
    ) -> Record:
        """Store one answer, checked and inserted in one transaction; returns the stored row."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                r = self._check_open(round_id, turn)
                values = (
                    round_id,
                    turn,
                    r.mode,
                    r.player,
                    r.sender,
                    r.adapter,
                    r.adapter_hash,
                    r.target_id,
                    r.target,
                    emoji,
                    text,
                    similarity,
                    judge_guess,
                    judge_similarity,
                    time.time(),
                )
                cursor = self._db.execute(
                    f"INSERT INTO answers ({', '.join(ANSWER_COLUMNS[1:])}) "
                    f"VALUES ({', '.join('?' * len(values))})",
                    values,
                )
            except sqlite3.IntegrityError as err:
                # Two servers on one file can race past the check above: the UNIQUE key still holds.
                self._db.execute("ROLLBACK")
                raise DuplicateAnswer(
                    f"turn {turn} of this round is answered already (submitted twice?)"
                ) from err
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        return dict(zip(ANSWER_COLUMNS, (cursor.lastrowid, *values), strict=True))

    def answers(
        self, mode: Mode | None = None, round_id: str | None = None, columns: Iterable[str] = ANSWER_COLUMNS
    ) -> list[Record]:
        """Every stored answer, oldest first (optionally one mode's, one round's; only some `columns`:
        the leaderboard reads 5 of the 16, a third of the time)."""
        unknown = set(columns) - set(ANSWER_COLUMNS)
        if unknown:
            raise ValueError(f"no such answer columns: {sorted(unknown)}")
        filters = {"mode": mode, "round_id": round_id}
        where = [f"{column} = ?" for column, value in filters.items() if value is not None]
        params = tuple(value for value in filters.values() if value is not None)
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join(columns)} FROM answers "
                f"{'WHERE ' + ' AND '.join(where) if where else ''} ORDER BY id",
                params,
            ).fetchall()
        return [dict(r) for r in rows]

    def rounds_per_sender(self, mode: Mode) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute(
                "SELECT sender, COUNT(*) FROM rounds WHERE mode = ? GROUP BY sender", (mode,)
            ).fetchall()
        return {sender: n for sender, n in rows}

    def rounds_per_target(self, mode: Mode, sender: str | None = None) -> dict[str, int]:
        where = "mode = ?" + (" AND sender = ?" if sender is not None else "")
        params = (mode, sender) if sender is not None else (mode,)
        with self._lock:
            rows = self._db.execute(
                f"SELECT target_id, COUNT(*) FROM rounds WHERE {where} GROUP BY target_id", params
            ).fetchall()
        return {target_id: n for target_id, n in rows}

    def export_jsonl(self, path: str | Path) -> int:
        """All answers to a JSONL file (atomically replaced); returns the number of rows."""
        return write_jsonl(path, self.answers())
