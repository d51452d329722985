"""What one GRPO step plays: B prompts x G games (`play`: turn t of every live episode goes out as one
batch), groups with no reward spread set aside, and with dynamic sampling (DAPO) more prompts drawn
until B groups carry signal. Under `accelerate launch` B is the step's prompts over all processes:
each process plays its share (`prompts_per_process`), drawn from one order shared by all
processes, and refills its own share.

Where the game seats the policy in several chats, a prompt's G episodes make one group per seat
(`EpisodeGroup.seat`), each with its own rewards, advantages and rows; a prompt carries signal when
any of its seats' groups does (docs/DESIGN.md §14)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from emoji_rl.decode.sampler import Sampler
from emoji_rl.errors import UserError
from emoji_rl.lm.distributed import gather
from emoji_rl.play.loop import play
from emoji_rl.play.types import Episode, EpisodeGroup, GameSetup
from emoji_rl.rl import grpo
from emoji_rl.rl.checkpoint import TrainState


def prompts_per_process(batch_size: int, processes: int) -> int:
    """Each process's share of a step's `batch_size` prompts. A step trains `batch_size` prompts on any
    number of processes (the seed's 32 stay 32 over 4 GPUs), so the learning rate and the KL weight tuned
    for it keep their meaning; the share must be whole."""
    if batch_size % processes:
        raise UserError(
            f"batch_size={batch_size} (prompts per step over all processes) does not divide among "
            f"{processes} processes: set batch_size to a multiple of {processes}, or launch a number of "
            "processes that divides it"
        )
    return batch_size // processes


class PromptStream:
    """Prompts in a seeded shuffled order, epoch after epoch; the position is part of the checkpoint.

    Every process holds the same stream (same seed) and draws the requests of all processes in rank
    order, keeping its own slice: no two processes play the same prompt in a step, and every
    process's cursor stays the one the main process checkpoints. `take` is therefore a collective."""

    def __init__(
        self,
        records: Sequence[dict[str, str]],
        seed: int,
        state: TrainState,
        rank: int = 0,
        gather_counts: Callable[[int], list[int]] = gather,
    ) -> None:
        self.records = records
        self.seed = seed
        self.state = state
        self.rank = rank
        self.gather_counts = gather_counts

    def take(self, n: int) -> list[dict[str, str]]:
        """This process's `n` prompts; every process must call it, with its own `n` (0 included)."""
        counts = self.gather_counts(n)
        drawn = self._draw(sum(counts))
        start = sum(counts[: self.rank])
        return drawn[start : start + n]

    def _draw(self, n: int) -> list[dict[str, str]]:
        out = []
        while len(out) < n:
            order = random.Random(self.seed + self.state.epoch).sample(
                range(len(self.records)), len(self.records)
            )
            out.append(self.records[order[self.state.cursor]])
            self.state.cursor += 1
            if self.state.cursor == len(self.records):
                self.state.epoch, self.state.cursor = self.state.epoch + 1, 0
        return out


@dataclass
class Baselines:
    """What each (group, seat)'s rewards are measured against (`baseline`): its group's mean, GRPO's
    (`grpo.seat_advantages`), or its seat's moving average over the steps (`grpo.ema_advantages`),
    whose `values` a checkpoint keeps (`TrainState.baselines`). The moving average is of every
    process's rewards (`gather`, a collective), so every process holds the same one."""

    scale_rewards: grpo.ScaleRewards = "group"
    baseline: grpo.Baseline = "group"
    decay: float = 0.95
    values: dict[str, float] = field(default_factory=dict)
    """Each seat's moving average, after the last step played (`ema` only)."""
    gather: Callable[[object], list] = gather

    def keeps(self, group: EpisodeGroup) -> bool:
        """Whether a group carries signal: rewards that differ, or any against a moving average."""
        if self.baseline == "ema":
            return True
        return not grpo.zero_spread_groups(torch.tensor([group.rewards], dtype=torch.float)).item()

    def advantages(self, groups: Sequence[EpisodeGroup]) -> list[tuple[float, ...]]:
        """Each group's advantages, over this process's groups (`ema`: a collective, and the moving
        averages move on by the step's mean reward of each seat over every process's groups)."""
        rewards, seats = [g.rewards for g in groups], [g.seat for g in groups]
        if self.baseline == "group":
            return grpo.seat_advantages(rewards, seats, self.scale_rewards)
        sums: dict[str, list[float]] = {}
        for seat, row in zip(seats, rewards, strict=True):
            total = sums.setdefault(seat, [0.0, 0.0])
            total[0], total[1] = total[0] + sum(row), total[1] + len(row)
        parts = self.gather(sums)
        means = {
            seat: sum(p[seat][0] for p in parts if seat in p) / sum(p[seat][1] for p in parts if seat in p)
            for seat in dict.fromkeys(s for p in parts for s in p)
        }
        used, after = grpo.ema_baselines(self.values, means, self.decay)
        self.values.clear()
        self.values.update(after)
        return grpo.ema_advantages(rewards, seats, used, self.scale_rewards)


@dataclass
class StepGroups:
    """What one step played: the groups kept for the update, and everything played, for metrics."""

    kept: list[EpisodeGroup]
    played: list[EpisodeGroup]
    seconds: float


async def collect(
    stream: PromptStream,
    setup: GameSetup,
    sampler: Sampler,
    batch_size: int,
    group_size: int,
    baselines: Baselines,
    resample_rounds: int = 0,
) -> StepGroups:
    """Play `group_size` games per prompt for `batch_size` prompts; groups that carry no signal (all
    rewards equal, against their group's mean) are not kept. `resample_rounds` > 0 draws new prompts
    to replace prompts none of whose seats' groups is kept. Every round runs on every process, even one
    already full (it draws 0), as `take` is a collective. Each played group carries its advantages
    (`baselines`, over this process's groups): the update trains on them and the rollout log shows them."""
    start = time.perf_counter()
    played: list[EpisodeGroup] = []
    kept_at: list[int] = []
    kept_prompts = 0
    for _ in range(1 + resample_rounds):
        records = stream.take(batch_size - kept_prompts)
        if not records:
            continue
        games = [setup.make_env(record) for record in records for _ in range(group_size)]
        episodes = await play(games, sampler)
        for p, record in enumerate(records):
            mine = tuple(episodes[p * group_size : (p + 1) * group_size])
            _check_seats(setup, mine)
            groups = [
                EpisodeGroup(str(record.get("id", p)), mine, target=setup.target(record), seat=seat.name)
                for seat in setup.seats
            ]
            signal = [len(played) + k for k, group in enumerate(groups) if baselines.keeps(group)]
            kept_prompts += bool(signal)
            kept_at += signal
            played += groups
    advantages = baselines.advantages(played)
    played = [replace(group, advantages=a) for group, a in zip(played, advantages, strict=True)]
    return StepGroups([played[i] for i in kept_at], played, time.perf_counter() - start)


def _check_seats(setup: GameSetup, episodes: Sequence[Episode]) -> None:
    """A game of several seats gives each its terminal reward and a turn in every episode: a seat
    with no turn would be a row with nothing to train."""
    if not setup.seated:
        return
    for episode in episodes:
        for seat in setup.seats:
            if seat.name not in episode.rewards or not episode.of(seat.name).turns:
                raise ValueError(
                    f"{setup.description}: an episode gave seat {seat.name!r} no terminal reward "
                    f"(StepResult.seat_rewards: {sorted(episode.rewards)}) or no turn: every seat a game "
                    "declares plays a turn and is rewarded in every episode"
                )
