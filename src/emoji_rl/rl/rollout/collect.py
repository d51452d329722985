"""What one GRPO step plays: B prompts x G games (`play`: turn t of every live episode goes out as one
batch), groups with no reward spread set aside, and with dynamic sampling (DAPO) more prompts drawn
until B groups carry signal. Under `accelerate launch` B is the step's prompts over all processes:
each process plays its share (`prompts_per_process`), drawn from one order shared by all
processes, and refills its own share."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from emoji_rl.decode.sampler import Sampler
from emoji_rl.errors import UserError
from emoji_rl.lm.distributed import gather
from emoji_rl.play.loop import play
from emoji_rl.play.types import EpisodeGroup, GameSetup
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
    scale_rewards: grpo.ScaleRewards,
    resample_rounds: int = 0,
) -> StepGroups:
    """Play `group_size` games per prompt for `batch_size` prompts; groups whose rewards are all equal
    carry no signal and are not kept. `resample_rounds` > 0 draws new prompts to replace them.
    Every round runs on every process, even one already full (it draws 0), as `take` is a collective.
    Each played group carries its advantages (`grpo.step_advantages`, over this process's kept groups):
    the update trains on them and the rollout log shows them."""
    start = time.perf_counter()
    played: list[EpisodeGroup] = []
    kept_at: list[int] = []
    for _ in range(1 + resample_rounds):
        records = stream.take(batch_size - len(kept_at))
        if not records:
            continue
        games = [setup.make_env(record) for record in records for _ in range(group_size)]
        episodes = await play(games, sampler)
        for p, record in enumerate(records):
            group = EpisodeGroup(
                str(record.get("id", p)),
                tuple(episodes[p * group_size : (p + 1) * group_size]),
                target=setup.target(record),
            )
            if not grpo.zero_spread_groups(torch.tensor([group.rewards], dtype=torch.float)).item():
                kept_at.append(len(played))
            played.append(group)
    advantages = grpo.step_advantages([group.rewards for group in played], scale_rewards)
    played = [replace(group, advantages=a) for group, a in zip(played, advantages, strict=True)]
    return StepGroups([played[i] for i in kept_at], played, time.perf_counter() - start)
