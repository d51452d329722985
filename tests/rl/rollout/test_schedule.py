"""Rollouts played ahead of the update: the fixed schedule (step t by version max(first, t - K),
whatever the timing), the staleness guard, an error handed to the step it failed, and a close that
cancels what is in flight."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from emoji_rl.play.types import Episode, EpisodeGroup, StepResult, Turn
from emoji_rl.rl.rollout.collect import StepGroups
from emoji_rl.rl.rollout.schedule import RolloutsAhead, StepRollouts, drop_stale, version_for, without_stale


def test_each_step_is_sampled_k_versions_behind_never_before_the_first():
    assert [version_for(t, 0) for t in range(4)] == [0, 1, 2, 3]
    assert [version_for(t, 1) for t in range(4)] == [0, 0, 1, 2]
    assert [version_for(t, 2) for t in range(5)] == [0, 0, 0, 1, 2]
    # A resume at step 7 whose checkpoint kept version 6 only: K=2 cannot reach 5.
    assert [version_for(t, 2, first_version=6) for t in range(7, 10)] == [6, 6, 7]


def group(prompt_id, *versions):
    turn = lambda v: Turn((1,), (2,), (-0.1,), StepResult(True, 0.0), v)  # noqa: E731
    return EpisodeGroup(
        prompt_id, tuple(Episode((turn(v),)) for v in versions), advantages=(0.0,) * len(versions)
    )


def test_a_group_with_a_turn_past_the_bound_is_dropped_whole_and_counted():
    groups = [
        group("fresh", 4, 4),
        group("one-behind", 3, 4),
        group("stale", 4, 2),
        group("in-process", None, None),
    ]
    kept, dropped = drop_stale(groups, step=4, max_off_policy_steps=1)
    assert [g.prompt_id for g in kept] == ["fresh", "one-behind", "in-process"]
    assert dropped == 2  # both episodes of "stale", though only one of them was too old
    assert drop_stale(groups, step=4, max_off_policy_steps=2) == (groups, 0)

    played = StepRollouts(4, 3, StepGroups(groups, groups, 1.0), {}, (0, 8))
    trimmed, count = without_stale(played, 1)
    assert count == 2 and trimmed.groups.kept == kept and trimmed.groups.played == groups


class Schedule:
    """A stand-in for the trainer and the servers: plays take random times, updates too, and every
    event is logged with the thread's view of what was published."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.events = []
        self.published = set()

    def log(self, *event):
        with self.lock:
            self.events.append(event)

    async def play(self, step, version, name):
        with self.lock:
            assert version in self.published, f"step {step} started before version {version} was published"
            assert name == f"v{version}"
        self.log("start", step, version)
        await asyncio.sleep(self.rng.uniform(0, 0.02))
        self.log("done", step, version)
        return StepRollouts(step, version, StepGroups([], [], 0.0), {}, (0, step))

    def publish(self, ahead, version):
        with self.lock:
            self.published.add(version)
        ahead.publish(version, f"v{version}")


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_schedule_holds_whatever_the_timing(k, seed):
    schedule = Schedule(seed)
    ahead = RolloutsAhead(schedule.play, 0, 8, k)
    try:
        schedule.publish(ahead, 0)
        for step in range(8):
            played = ahead.take(step)
            assert (played.step, played.version) == (step, max(0, step - k))
            schedule.log("update", step)
            time.sleep(schedule.rng.uniform(0, 0.02))
            schedule.publish(ahead, step + 1)
    finally:
        ahead.close()
    starts = [(e[1], e[2]) for e in schedule.events if e[0] == "start"]
    assert starts == [(t, max(0, t - k)) for t in range(8)]
    # K = 0 is lockstep: no step starts before the update of the step before it ended; with K > 0
    # a step's rollouts never start more than K + 1 steps ahead of the update.
    for i, event in enumerate(schedule.events):
        if event[0] == "start":
            updates = [e[1] for e in schedule.events[:i] if e[0] == "update"]
            assert event[1] - (max(updates, default=-1) + 1) <= k, schedule.events


def test_a_failed_step_is_raised_by_its_own_take_after_the_steps_before_it():
    class ServerDied(Exception):
        pass

    async def play(step, version, name):
        if step == 2:
            raise ServerDied("http://127.0.0.1:9/v1/completions did not answer")
        return StepRollouts(step, version, StepGroups([], [], 0.0), {}, (0, step))

    ahead = RolloutsAhead(play, 0, 5, 2)
    ahead.publish(0, "v0")
    assert ahead.take(0).step == 0 and ahead.take(1).step == 1
    with pytest.raises(ServerDied, match=r"127\.0\.0\.1:9"):
        ahead.take(2)
    ahead.close()


def test_close_cancels_the_step_in_flight_and_ends_the_thread():
    started, cancelled = threading.Event(), threading.Event()

    async def play(step, version, name):
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    ahead = RolloutsAhead(play, 0, 3, 1)
    ahead.publish(0, "v0")
    assert started.wait(5)
    begin = time.monotonic()
    ahead.close()
    assert cancelled.is_set() and time.monotonic() - begin < 5
    assert not any(thread.name == "rollouts-ahead" for thread in threading.enumerate())


def test_close_before_a_version_is_published_ends_the_waiting_thread():
    async def play(step, version, name):
        raise AssertionError("no version was published: nothing may be played")

    ahead = RolloutsAhead(play, 0, 3, 0)
    ahead.close()
    assert not any(thread.name == "rollouts-ahead" for thread in threading.enumerate())


def test_in_process_steps_are_played_on_the_callers_thread_when_asked():
    threads = []

    async def play(step, version, name):
        threads.append(threading.current_thread())
        return StepRollouts(step, version, StepGroups([], [], 0.0), {}, (0, step))

    ahead = RolloutsAhead(play, 3, 6, 0, background=False)
    assert [ahead.take(t).version for t in (3, 4)] == [3, 4]
    assert threads == [threading.current_thread()] * 2
    with pytest.raises(ValueError, match="cannot run ahead"):
        RolloutsAhead(play, 0, 3, 1, background=False)
