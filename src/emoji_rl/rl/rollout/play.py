"""Play games turn by turn with any sampler: turn t of every live episode goes out as one batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from emoji_rl.rl.types import Episode, Game, StepResult, Turn


@dataclass(frozen=True)
class Sample:
    """One sampled turn: ids as sampled (stop token included) and their log-probs under the
    distribution the sampler drew from (grammar-masked, temperature applied)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class Sampler(Protocol):
    async def sample(self, prompts: Sequence[tuple[int, ...]]) -> list[Sample]:
        """One sample per prompt (a whole episode so far, as token ids), in order."""
        ...


async def play(games: Sequence[Game], sampler: Sampler) -> list[Episode]:
    """Play every game to the end. Each turn, all live episodes are sampled in one call and stepped
    concurrently, so their judge calls and similarities batch too."""
    observations = list(await asyncio.gather(*(game.start() for game in games)))
    sequences = [tuple(obs) for obs in observations]
    turns: list[list[Turn]] = [[] for _ in games]
    live = list(range(len(games)))
    while live:
        samples = await sampler.sample([sequences[i] for i in live])
        results: list[StepResult] = list(
            await asyncio.gather(*(games[i].step(s.token_ids) for i, s in zip(live, samples, strict=True)))
        )
        still_live = []
        for i, sample, result in zip(live, samples, results, strict=True):
            turns[i].append(Turn(tuple(observations[i]), sample.token_ids, sample.logprobs, result))
            if not result.done:
                observations[i] = result.next_observation_ids
                sequences[i] = (*sequences[i], *sample.token_ids, *result.next_observation_ids)
                still_live.append(i)
        live = still_live
    return [Episode(tuple(t)) for t in turns]
