"""The turn loop: any games, played to the end by any sampler. The trainer's rollouts, the evaluation
and play-game all play through it, so a game behaves the same wherever it is played."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from emoji_rl.play.types import Env, Episode, StepResult, Turn

if TYPE_CHECKING:
    from emoji_rl.decode.sampler import Sample, Sampler


async def play(envs: Sequence[Env], sampler: Sampler) -> list[Episode]:
    """Play every episode to the end. Each turn, all live episodes are sampled in one call and stepped
    concurrently, so their judge calls and similarities batch too."""
    observations = list(await asyncio.gather(*(env.start() for env in envs)))
    sequences = [tuple(obs) for obs in observations]
    turns: list[list[Turn]] = [[] for _ in envs]
    live = list(range(len(envs)))
    previous: dict[int, Sample] = {}
    while live:
        samples = await sampler.sample([sequences[i] for i in live], [previous.get(i) for i in live])
        previous = {}
        results: list[StepResult] = list(
            await asyncio.gather(*(envs[i].step(s.token_ids) for i, s in zip(live, samples, strict=True)))
        )
        still_live = []
        for i, sample, result in zip(live, samples, results, strict=True):
            turns[i].append(
                Turn(tuple(observations[i]), sample.token_ids, sample.logprobs, result, sample.version)
            )
            if not result.done:
                observations[i] = result.next_observation_ids
                sequences[i] = (*sequences[i], *sample.token_ids, *result.next_observation_ids)
                previous[i] = sample
                still_live.append(i)
        live = still_live
        del samples  # the finished episodes' KV caches (`Sample.resume`) go before the next turn decodes
    return [Episode(tuple(t)) for t in turns]
