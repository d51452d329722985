"""The async schedule of a GRPO run (docs/DESIGN.md §7): which adapter version samples which step,
when each version is published to the policy server, which versions a checkpoint keeps, and the
rollouts played ahead of the update on a thread of their own. With `max_off_policy_steps` K > 0 the
policy server samples step t+1's episodes while the trainer still updates on step t's, so neither
side waits for the other.

The schedule is fixed, not timed: step t is sampled by adapter version `version_for(t)` =
max(first, t - K), version v being the adapter the trainer published after its step v (0: the
starting adapter), and by no other. So a run is a function of its seed whatever the two sides'
speeds, no episode trains more than K versions after the adapter that sampled it, and a resume is
exact: the checkpoint at step s holds the adapters its unplayed steps are sampled by (versions
s-K .. s-1) and the prompt cursor as of step s's draws; what was in flight is drawn and played again.
K = 0 is lockstep: step t waits for version t, the adapter of the update just made.

With an in-process sampler (`--engine hf`) there is no thread and nothing is published: each step is
played when the loop asks for it, by the weights being trained. How a version reaches the server is
`rl/rollout/vllm.py`'s `AdapterSync`; what a step plays, `rl/rollout/collect.py`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from emoji_rl.lm.distributed import adapter_state_dict, gather, save_adapter, whole_weights
from emoji_rl.play.types import EpisodeGroup
from emoji_rl.rl.checkpoint import TrainState, behaviour_adapters
from emoji_rl.rl.rollout.collect import Baselines, PromptStream, StepGroups, collect, prompts_per_process
from emoji_rl.rl.rollout.servers import ServerWatch, watched

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

    from emoji_rl.play.types import GameSetup
    from emoji_rl.rl.engine import Engine
    from emoji_rl.rl.rollout.vllm import AdapterSync
    from emoji_rl.rl.train_config import TrainConfig
    from emoji_rl.rl.trainer import Trainer


@dataclass(frozen=True)
class StepRollouts:
    """One step's rollouts as the loop receives them."""

    step: int
    version: int
    """The adapter version that sampled them (the step itself in-process)."""
    groups: StepGroups
    services: dict[str, float]
    """Seconds this step's games spent in each service (the judge, the embedder)."""
    position: tuple[int, int]
    """The prompt stream's (epoch, cursor) after this step's draws: what a checkpoint after it stores."""
    baselines: dict[str, float] = field(default_factory=dict)
    """Each seat's moving-average baseline after this step's rollouts (`Baselines.values`): the same."""
    servers: dict[str, float] = field(default_factory=dict)
    """What the servers said of this step (`rl/rollout/servers.py`); on the main process, which logs."""


PlayStep = Callable[[int, int, "str | None"], Awaitable[StepRollouts]]
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


def without_stale(played: StepRollouts, max_off_policy_steps: int) -> tuple[StepRollouts, int]:
    """`played` with its kept groups past the staleness bound dropped (`drop_stale`), and their count."""
    kept, dropped = drop_stale(played.groups.kept, played.step, max_off_policy_steps)
    if not dropped:
        return played, 0
    return replace(played, groups=replace(played.groups, kept=kept)), dropped


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
        self._done: dict[int, StepRollouts] = {}
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

    def take(self, step: int) -> StepRollouts:
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


# --- the run's schedule ----------------------------------------------------------------------------


def publish(sync: AdapterSync, accelerator: Accelerator, version: int, save: Callable[[Path], None]) -> str:
    """The main process saves version `version` with `save(directory)` and loads it on the vLLM
    server; every process returns the name it is served under (a collective, which also waits for the
    load)."""
    name = sync.publish(version, save) if accelerator.is_main_process else None
    return sync.follow(gather(name)[0])


def publish_weights(sync: AdapterSync, accelerator: Accelerator, model: torch.nn.Module, version: int) -> str:
    """Publish the adapter being trained as version `version`. Every process gathers its weights
    first: under FSDP each holds only a shard."""
    state = adapter_state_dict(model)
    return publish(sync, accelerator, version, lambda path: save_adapter(model, path, state))


class RolloutSchedule:
    """One run's rollouts, step by step, by the versions the schedule gives them: `start` publishes
    the first ones, `take` hands over each step's rollouts, `publish` each version after its update,
    `behaviour` the versions a checkpoint keeps, `close` stops the rollouts. In process (the engine
    not `on_server`) only `take` does anything, with the trainer's whole weights."""

    def __init__(self, ahead: RolloutsAhead, trainer: Trainer, engine: Engine, kept: dict[int, Path]) -> None:
        self.ahead, self.trainer, self.engine, self.kept = ahead, trainer, engine, kept

    def start(self) -> None:
        """Publish the versions the first steps are sampled by: those the checkpoint kept (`kept`),
        then the weights now, after clearing what an earlier session left on the server."""
        sync = self.engine.sync
        if sync is None:  # in process
            return
        if self.trainer.accelerator.is_main_process:
            sync.clear_stale()
        for version, path in sorted(self.kept.items()):
            copy = functools.partial(shutil.copytree, path)
            self.ahead.publish(version, publish(sync, self.trainer.accelerator, version, copy))
        self.publish(self.ahead.first_step)

    def take(self, step: int) -> tuple[StepRollouts, int]:
        """Step `step`'s rollouts without those past the staleness bound (`without_stale`), and how
        many episodes that dropped."""
        # The in-process sampler decodes with the model being trained: under FSDP, on its whole weights.
        weights = contextlib.nullcontext() if self.engine.on_server else whole_weights(self.trainer.model)
        with weights:
            played = self.ahead.take(step)
        return without_stale(played, self.ahead.max_off_policy_steps)

    def publish(self, version: int) -> None:
        """The trainer's weights are version `version`: on the server, and free to sample its steps."""
        if self.engine.sync is not None:
            name = publish_weights(self.engine.sync, self.trainer.accelerator, self.trainer.model, version)
            self.ahead.publish(version, name)

    def behaviour(self, step: int) -> dict[int, Path]:
        """The adapters the steps after `step` are sampled by, for its checkpoint to keep, so that a
        resume samples them alike; on the main process, which writes checkpoints (none elsewhere)."""
        sync = self.engine.sync
        if sync is None or not self.trainer.accelerator.is_main_process:
            return {}
        return {v: sync.adapter_path(v) for v in range(self.ahead.version_for(step), step)}

    def close(self) -> None:
        self.ahead.close()


def rollout_schedule(
    cfg: TrainConfig,
    trainer: Trainer,
    setup: GameSetup,
    engine: Engine,
    state: TrainState,
    checkpoint: Path | None,
) -> RolloutSchedule:
    """Steps `state.step` on, played in-process or, on a vLLM server, on a thread by the version K
    behind, from a prompt stream of their own that starts where the checkpoint's stopped."""
    background, sampler = engine.on_server, engine.sampler
    rank = trainer.accelerator.process_index
    share = prompts_per_process(cfg.batch_size, trainer.accelerator.num_processes)
    # The thread's prompt draws are a collective among the processes: on a group of their own, so
    # that they never interleave with the update's.
    group = rollout_group(cfg.collective_timeout_s) if background else None
    stream = PromptStream(
        setup.records,
        cfg.seed,
        replace(state, baselines=dict(state.baselines)),
        rank,
        gather_counts=lambda n: gather(n, group),
    )
    baselines = Baselines(
        cfg.scale_rewards,
        cfg.baseline,
        cfg.baseline_decay,
        stream.state.baselines,
        lambda x: gather(x, group),
    )
    rounds = cfg.max_resample_rounds if cfg.dynamic_sampling else 0
    main = trainer.accelerator.is_main_process
    policy = engine.sync.endpoint if engine.sync is not None else None
    watch = ServerWatch(watched(policy, setup.servers) if main else {})
    if background:
        from emoji_rl.decode.vllm import request_seed

    async def play(step: int, version: int, name: str | None) -> StepRollouts:
        # On a server, each step's requests are seeded from (seed, rank, step): what a step samples
        # does not depend on what ran before it, so a resume redraws a lost step exactly.
        bound = sampler if name is None else sampler.at(version, name, request_seed(cfg.seed, rank, step))
        stream.state.step = step  # the stream's own copy of the state: the step it draws for
        before = setup.seconds()
        games = collect(stream, setup, bound, share, cfg.group_size, baselines, rounds)
        played, servers = await watch.during(games)
        services = {k: v - before.get(k, 0.0) for k, v in setup.seconds().items()}
        position = (stream.state.epoch, stream.state.cursor)
        return StepRollouts(
            step, version, played, services, position, baselines=dict(baselines.values), servers=servers
        )

    kept = behaviour_adapters(checkpoint) if checkpoint is not None and background else {}
    ahead = RolloutsAhead(
        play,
        state.step,
        cfg.max_steps,
        cfg.max_off_policy_steps,
        first_version=min(kept, default=state.step),
        background=background,
    )
    return RolloutSchedule(ahead, trainer, engine, kept)


def rollout_group(timeout_s: int):
    """A gloo process group for the rollout thread's collectives, which wait `timeout_s` for a peer as
    the run's own group does (gloo's default is 30 minutes); None with one process."""
    from datetime import timedelta

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    return None
