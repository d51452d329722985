"""Rollouts played ahead of the update (docs/DESIGN.md §7): with `max_off_policy_steps` K > 0 the
policy server samples step t+1's episodes while the trainer still updates on step t's, so neither
side waits for the other.

The schedule is fixed, not timed: step t is sampled by adapter version `version_for(t)` =
max(first, t - K), version v being the adapter the trainer published after its step v (0: the
starting adapter), and by no other. So a run is a function of its seed whatever the two sides'
speeds, no episode trains more than K versions after the adapter that sampled it, and a resume is
exact: the checkpoint at step s holds the adapters its unplayed steps are sampled by (versions
s-K .. s-1) and the prompt cursor as of step s's draws; what was in flight is drawn and played again.
K = 0 is lockstep: step t waits for version t, the adapter of the update just made.

With an in-process sampler (`--engine hf`) there is no thread: each step is played when the loop
asks for it, by the weights being trained."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from emoji_rl.game.types import EpisodeGroup
from emoji_rl.rl.rollout.collect import Rollouts


@dataclass(frozen=True)
class Played:
    """One step's rollouts as the loop receives them."""

    step: int
    version: int
    """The adapter version that sampled them (the step itself in-process)."""
    rollouts: Rollouts
    services: dict[str, float]
    """Seconds this step's games spent in each service (the judge, the embedder)."""
    position: tuple[int, int]
    """The prompt stream's (epoch, cursor) after this step's draws: what a checkpoint after it stores."""


PlayStep = Callable[[int, int, "str | None"], Awaitable[Played]]
"""play(step, version, served name of that version or None in-process)."""


class Closed(Exception):
    """The loop stopped the rollouts (it is ending, or failed)."""


def version_for(step: int, max_off_policy_steps: int, first_version: int = 0) -> int:
    """The adapter version that samples `step`: K behind, never one older than the first available."""
    return max(first_version, step - max_off_policy_steps)


def drop_stale(
    groups: Sequence[EpisodeGroup], step: int, max_off_policy_steps: int
) -> tuple[list[EpisodeGroup], int]:
    """The groups whose every turn was sampled at most K versions before `step`, and the number of
    episodes dropped with the others: a whole group goes, as its advantages are relative to each
    other. The fixed schedule never plays such a group; this is where one would be refused, never
    trained on silently. A turn sampled in-process (no version) is on-policy."""
    kept, dropped = [], 0
    for group in groups:
        lags = [
            step - turn.sampler_version
            for episode in group.episodes
            for turn in episode.turns
            if turn.sampler_version is not None
        ]
        if lags and max(lags) > max_off_policy_steps:
            dropped += len(group.episodes)
        else:
            kept.append(group)
    return kept, dropped


def without_stale(played: Played, max_off_policy_steps: int) -> tuple[Played, int]:
    """`played` with its kept groups past the staleness bound dropped (`drop_stale`), and their count."""
    kept, dropped = drop_stale(played.rollouts.kept, played.step, max_off_policy_steps)
    if not dropped:
        return played, 0
    return replace(played, rollouts=replace(played.rollouts, kept=kept)), dropped


class RolloutsAhead:
    """Plays steps `first_step` .. `last_step - 1` in order, each with the version `version_for` gives it.

    `background`: on a thread of its own with an event loop of its own (a vLLM sampler), starting a
    step as soon as its version is published; otherwise in the caller's thread, when `take` asks.
    The loop publishes each version (`publish`) and takes each step's rollouts (`take`) in order; an
    error of the thread is raised by the `take` of the step it failed, and `close` stops the thread,
    cancelling what it was playing."""

    def __init__(
        self,
        play: PlayStep,
        first_step: int,
        last_step: int,
        max_off_policy_steps: int,
        *,
        first_version: int | None = None,
        background: bool = True,
    ) -> None:
        if max_off_policy_steps < 0:
            raise ValueError(f"max_off_policy_steps={max_off_policy_steps} must be >= 0")
        if max_off_policy_steps > 0 and not background:
            raise ValueError(
                "an in-process sampler plays with the weights being trained: it cannot run ahead"
            )
        self.play = play
        self.first_step = first_step
        self.last_step = last_step
        self.max_off_policy_steps = max_off_policy_steps
        self.first_version = first_step if first_version is None else first_version
        self._names: dict[int, str] = {}
        self._done: dict[int, Played] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._thread = (
            threading.Thread(target=self._run, name="rollouts-ahead", daemon=True) if background else None
        )
        if self._thread is not None:
            self._thread.start()

    def version_for(self, step: int) -> int:
        return version_for(step, self.max_off_policy_steps, self.first_version)

    def publish(self, version: int, name: str) -> None:
        """Version `version` is served as `name`: the steps sampled by it may start."""
        with self._changed:
            self._names[version] = name
            self._changed.notify_all()

    def name(self, version: int) -> str | None:
        with self._changed:
            return self._names.get(version)

    def take(self, step: int) -> Played:
        """Step `step`'s rollouts, played now (in-process) or waited for (background)."""
        if self._thread is None:
            return asyncio.run(self.play(step, step, None))
        with self._changed:
            while step not in self._done and self._error is None:
                self._changed.wait()
            if step in self._done:
                return self._done.pop(step)
            raise self._error

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread: a step it is playing is cancelled, and it plays no other."""
        if self._thread is None:
            return
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            # Under the lock: the thread drops its loop under it too, before closing it.
            if self._loop is not None and self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout)

    # --- the thread -----------------------------------------------------------------------------

    def _wait_for_version(self, version: int) -> str:
        with self._changed:
            while version not in self._names and not self._closed:
                self._changed.wait()
            if self._closed:
                raise Closed
            return self._names[version]

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        try:
            for step in range(self.first_step, self.last_step):
                version = self.version_for(step)
                name = self._wait_for_version(version)
                with self._changed:
                    if self._closed:
                        raise Closed
                    self._loop, self._task = loop, loop.create_task(self.play(step, version, name))
                played = loop.run_until_complete(self._task)
                with self._changed:
                    self._done[step] = played
                    self._changed.notify_all()
        except (Closed, asyncio.CancelledError):
            pass
        except BaseException as err:  # handed to the loop's thread, which raises it in `take`
            with self._changed:
                self._error = err
                self._changed.notify_all()
        finally:
            with self._changed:
                self._loop = self._task = None
            loop.close()
