"""Seats (docs/DESIGN.md §14): a game that seats the policy in two chats is played with each seat's turns
in a token sequence of its own, each sampled under its seat's constraint with its own turn before; a
game of one seat is played and recorded as before."""

from __future__ import annotations

import asyncio

import pytest

from emoji_rl.decode.sampler import Sample
from emoji_rl.play.loop import play
from emoji_rl.play.types import POLICY, Env, Episode, GameSetup, Seat, StepResult, Turn

SENDER = Seat("sender", "grammar")
READER = Seat("reader", "none")


class TwoChats(Env):
    """Rounds of the sender's turn then the reader's, each in its chat: the sender's chat opens with
    (1, 2) and each later round adds (5,); the reader's opens with (3, 4), each later round adds (6,).
    The reader's reward is its last token, the sender's the round count."""

    def __init__(self, rounds: int = 2) -> None:
        self.rounds, self.played = rounds, 0

    async def start(self):
        self.seat = SENDER
        return (1, 2)

    async def step(self, action_ids):
        if self.seat is SENDER:
            self.seat = READER
            return StepResult(False, 0.0, (3, 4) if self.played == 0 else (6,))
        self.played += 1
        if self.played == self.rounds:
            rewards = {"sender": float(self.played), "reader": float(action_ids[-1])}
            return StepResult(True, rewards["sender"], seat_rewards=rewards, metrics={"rounds": self.played})
        self.seat = SENDER
        return StepResult(False, 0.0, (5,))


class Recorder:
    """Answers every prompt with (100 + its call's number, 7); keeps each call's prompts, turns before
    and constraint."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, list, str | None]] = []

    async def sample(self, prompts, previous=None, *, constraint=None):
        self.calls.append((list(prompts), list(previous or []), constraint))
        return [Sample((100 + len(self.calls), 7), (-0.1, -0.2)) for _ in prompts]


def test_each_seat_plays_in_its_own_token_sequence_under_its_constraint():
    sampler = Recorder()
    [episode] = asyncio.run(play([TwoChats(rounds=2)], sampler))
    prompts = [p for p, _, _ in sampler.calls]
    assert [c for _, _, c in sampler.calls] == ["grammar", "none", "grammar", "none"]
    assert prompts == [
        [(1, 2)],
        [(3, 4)],  # the reader's chat holds none of the sender's tokens
        [(1, 2, 101, 7, 5)],  # the sender's goes on from its own last turn
        [(3, 4, 102, 7, 6)],
    ]
    befores = [b for _, b, _ in sampler.calls]
    assert befores[0] == [None] and befores[1] == [None]  # each seat's first turn has none before it
    assert befores[2][0].token_ids == (101, 7) and befores[3][0].token_ids == (102, 7)
    assert [t.seat for t in episode.turns] == ["sender", "reader", "sender", "reader"]
    assert episode.of("sender").token_ids() == (1, 2, 101, 7, 5, 103, 7)
    assert episode.of("reader").token_ids() == (3, 4, 102, 7, 6, 104, 7)
    assert episode.of("reader").loss_mask() == (0, 0, 1, 1, 0, 1, 1)
    assert episode.rewards == {"sender": 2.0, "reader": 7.0}


class OneSeat(Env):
    async def start(self):
        return (1,)

    async def step(self, action_ids):
        return StepResult(True, 0.5)


class OldSampler:
    """A sampler written before seats: no `constraint` argument."""

    async def sample(self, prompts, previous=None):
        return [Sample((9,), (-1.0,)) for _ in prompts]


def test_a_game_of_one_seat_is_played_as_before():
    [episode] = asyncio.run(play([OneSeat()], OldSampler()))
    assert [t.seat for t in episode.turns] == [POLICY]
    assert episode.rewards == {POLICY: 0.5} and episode.of(POLICY) == episode
    setup = GameSetup(lambda r: OneSeat(), [], "grammar", "one seat")
    assert setup.seats == (Seat(POLICY, "grammar"),) and setup.constraint == "grammar"
    assert not setup.seated


def test_a_games_seats_are_named_apart():
    setup = GameSetup(lambda r: TwoChats(), [], (SENDER, READER), "two chats")
    assert setup.seated and setup.constraint == "grammar"
    for seats in ((SENDER, Seat("sender", "none")), (Seat(POLICY, "none"), READER), ()):
        with pytest.raises(ValueError, match="seat"):
            GameSetup(lambda r: TwoChats(), [], seats, "two chats")


def test_a_turn_records_no_seat_but_the_policys_by_default():
    turn = Turn((1,), (2,), (0.0,), StepResult(True, 1.0))
    assert turn.seat == POLICY and Episode((turn,)).rewards == {POLICY: 1.0}
