"""Play games turn by turn with any sampler: turn t of every live episode goes out as one batch."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from emoji_rl.rl.types import Episode, Game, StepResult, Turn


@dataclass(frozen=True)
class Sample:
    """One sampled turn: ids as sampled (stop token included) and their log-probs under the
    distribution the sampler drew from (grammar-masked, temperature applied)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    resume: Any = field(default=None, repr=False, compare=False)
    """What the sampler can go on from in the episode's next turn instead of reading it all again
    (the hf engine's KV cache of the row), or None."""


class Sampler(Protocol):
    async def sample(
        self, prompts: Sequence[tuple[int, ...]], previous: Sequence[Sample | None] | None = None
    ) -> list[Sample]:
        """One sample per prompt (a whole episode so far, as token ids), in order. `previous` is, per
        prompt, the episode's sample of the turn before (None on its first turn)."""
        ...


async def play(games: Sequence[Game], sampler: Sampler) -> list[Episode]:
    """Play every game to the end. Each turn, all live episodes are sampled in one call and stepped
    concurrently, so their judge calls and similarities batch too."""
    observations = list(await asyncio.gather(*(game.start() for game in games)))
    sequences = [tuple(obs) for obs in observations]
    turns: list[list[Turn]] = [[] for _ in games]
    live = list(range(len(games)))
    previous: dict[int, Sample] = {}
    while live:
        samples = await sampler.sample([sequences[i] for i in live], [previous.get(i) for i in live])
        previous = {}
        results: list[StepResult] = list(
            await asyncio.gather(*(games[i].step(s.token_ids) for i, s in zip(live, samples, strict=True)))
        )
        still_live = []
        for i, sample, result in zip(live, samples, results, strict=True):
            turns[i].append(Turn(tuple(observations[i]), sample.token_ids, sample.logprobs, result))
            if not result.done:
                observations[i] = result.next_observation_ids
                sequences[i] = (*sequences[i], *sample.token_ids, *result.next_observation_ids)
                previous[i] = sample
                still_live.append(i)
        live = still_live
        del samples  # the finished episodes' KV caches (`Sample.resume`) go before the next turn decodes
    return [Episode(tuple(t)) for t in turns]
