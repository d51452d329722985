"""The turn loop: any games, played to the end by any sampler. The trainer's rollouts, the evaluation
and play-game all play through it, so a game behaves the same wherever it is played.

A game may seat the policy in several chats (`Env.seat`, docs/DESIGN.md §14): each seat's turns
extend that seat's own token sequence, and the games whose turn is one seat's are sampled together,
under that seat's constraint, one sampler call per seat and pass."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from emoji_rl.play.types import POLICY, Env, Episode, Seat, StepResult, Turn

if TYPE_CHECKING:
    from emoji_rl.decode.sampler import Sample, Sampler


async def play(games: Sequence[Env], sampler: Sampler) -> list[Episode]:
    """Play every game to the end. Each turn, all live episodes are sampled in one call per seat and
    stepped concurrently, so their judge calls and similarities batch too."""
    observations = list(await asyncio.gather(*(game.start() for game in games)))
    # Per game, each seat's token sequence so far and its sample of its turn before (its KV cache).
    sequences: list[dict[str, tuple[int, ...]]] = [{} for _ in games]
    previous: list[dict[str, Sample]] = [{} for _ in games]
    turns: list[list[Turn]] = [[] for _ in games]
    live = list(range(len(games)))
    while live:
        seats = [games[i].seat for i in live]
        for i, seat in zip(live, seats, strict=True):
            name = _name(seat)
            sequences[i][name] = (*sequences[i].get(name, ()), *observations[i])
        samples = await _sample(sampler, live, seats, sequences, previous)
        results: list[StepResult] = list(
            await asyncio.gather(*(games[i].step(s.token_ids) for i, s in zip(live, samples, strict=True)))
        )
        still_live = []
        for i, seat, sample, result in zip(live, seats, samples, results, strict=True):
            name = _name(seat)
            turns[i].append(
                Turn(tuple(observations[i]), sample.token_ids, sample.logprobs, result, sample.version, name)
            )
            if not result.done:
                observations[i] = result.next_observation_ids
                sequences[i][name] = (*sequences[i][name], *sample.token_ids)
                previous[i][name] = sample
                still_live.append(i)
            else:
                previous[i].clear()
        live = still_live
        del samples  # the finished episodes' KV caches (`Sample.resume`) go before the next turn decodes
    return [Episode(tuple(t)) for t in turns]


def _name(seat: Seat | None) -> str:
    return POLICY if seat is None else seat.name


async def _sample(
    sampler: Sampler,
    live: Sequence[int],
    seats: Sequence[Seat | None],
    sequences: Sequence[dict[str, tuple[int, ...]]],
    previous: Sequence[dict[str, Sample]],
) -> list[Sample]:
    """One sample per live game, in `live`'s order: one sampler call per seat, in the order the
    seats first move (a game of one seat: one call, as the sampler is set)."""
    samples: dict[int, Sample] = {}
    for seat in dict.fromkeys(seats):
        name = _name(seat)
        mine = [i for i, s in zip(live, seats, strict=True) if s == seat]
        prompts = [sequences[i][name] for i in mine]
        before = [previous[i].get(name) for i in mine]
        if seat is None:
            drawn = await sampler.sample(prompts, before)
        else:
            drawn = await sampler.sample(prompts, before, constraint=seat.constraint)
        samples.update(zip(mine, drawn, strict=True))
    return [samples[i] for i in live]
