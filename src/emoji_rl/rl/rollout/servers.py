"""What the servers a GRPO step plays on say of that step, read from their own /metrics pages
(`io/server_metrics.py`) while its rollouts play: the policy server with `--engine vllm`, and those
the game's services ask (`GameSetup.servers`: an openai judge, an openai partner). Per role, in the
step's metrics:

- `server/<role>/prefix_cache_hit_rate`: the share of the prompt tokens the server looked up in its
  prefix cache that it found there, over the requests since the previous step's reading (its
  counters' growth, not their ratio since the server started); absent when it looked up none.
- `server/<role>/kv_cache_usage`, `server/<role>/running`, `server/<role>/waiting`: the most the
  step's readings saw of the KV cache in use (0 to 1) and of requests in the engine's batch and
  queued for it. They are read at the step's start, every `POLL_S` while it plays and at its end:
  a step's last request has ended by then, so a reading there alone would find the server idle.

A server whose page cannot be read (down, not vLLM, its stats off) never stops training: one warning,
and its keys are left out of each step it fails in. A server that serves two roles (a judge on the
policy's server) is read once, under the first. Under accelerate the main process reads, for the
line it writes: a server's counters count every process's requests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import replace
from typing import TypeVar

import httpx

from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint
from emoji_rl.io.server_metrics import PrefixCache, ServerLoad, read_load

log = logging.getLogger("emoji_rl.rollout.servers")

POLL_S = 1.0
READ_TIMEOUT_S = 5.0
"""A reading is one try with this timeout: a server slow to answer costs the step seconds, not the
endpoint's retries (half a minute)."""

T = TypeVar("T")


def watched(policy: Endpoint | None, game: Mapping[str, Endpoint]) -> dict[str, Endpoint]:
    """The roles to read: `policy` (None in process) first, then the game's, each server once."""
    roles: dict[str, Endpoint] = {}
    for role, endpoint in [("policy", policy), *game.items()]:
        if endpoint is not None and endpoint.url not in {e.url for e in roles.values()}:
            roles[role] = endpoint
    return roles


class ServerWatch:
    """Reads `servers` (role: endpoint) while each step plays (`during`); the steps are played one
    after the other, on one event loop at a time."""

    def __init__(self, servers: Mapping[str, Endpoint], poll_s: float = POLL_S) -> None:
        self.servers = {
            role: replace(endpoint, attempts=1, timeout_s=min(endpoint.timeout_s, READ_TIMEOUT_S))
            for role, endpoint in servers.items()
        }
        self.poll_s = poll_s
        self._counters: dict[str, PrefixCache] = {}
        """Each server's counters at the previous step's end."""
        self._unreadable: set[str] = set()

    async def during(self, work: Awaitable[T]) -> tuple[T, dict[str, float]]:
        """`work`'s result (a step's rollouts), and the servers' metrics over it."""
        if not self.servers:
            return await work, {}
        readings: dict[str, list[ServerLoad] | None] = {role: [] for role in self.servers}
        async with httpx.AsyncClient() as client:
            await self._read(client, readings)
            poller = asyncio.ensure_future(self._poll(client, readings))
            try:
                result = await work
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            await self._read(client, readings)
        return result, self._metrics(readings)

    async def _poll(self, client: httpx.AsyncClient, readings: dict[str, list[ServerLoad] | None]) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self._read(client, readings)

    async def _read(self, client: httpx.AsyncClient, readings: dict[str, list[ServerLoad] | None]) -> None:
        """One reading of every server not yet failed in this step (None: it did)."""
        roles = [role for role, seen in readings.items() if seen is not None]
        loads = await asyncio.gather(*(self._load(client, role) for role in roles))
        for role, load in zip(roles, loads, strict=True):
            seen = readings[role]
            if load is None or seen is None:
                readings[role] = None
            else:
                seen.append(load)

    async def _load(self, client: httpx.AsyncClient, role: str) -> ServerLoad | None:
        endpoint = self.servers[role]
        try:
            load = await read_load(client, endpoint)
        except (UserError, httpx.HTTPError, ValueError) as err:
            if role not in self._unreadable:
                self._unreadable.add(role)
                log.warning(
                    "could not read the %s server's %s/metrics (%s): the steps leave out server/%s/ until it can",
                    role,
                    endpoint.url,
                    err,
                    role,
                )
            return None
        if role in self._unreadable:
            self._unreadable.discard(role)
            log.info("the %s server's %s/metrics can be read again", role, endpoint.url)
        return load

    def _metrics(self, readings: Mapping[str, list[ServerLoad] | None]) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for role, loads in readings.items():
            if not loads:
                # The next step's rate starts from its own first reading.
                self._counters.pop(role, None)
                continue
            counters = loads[-1].prefix_cache
            grown = counters - self._counters.get(role, loads[0].prefix_cache)
            if grown.queries < 0 or grown.hits < 0:
                grown = counters  # the server restarted, and its counters with it
            self._counters[role] = counters
            key = f"server/{role}/"
            if grown.queries:
                metrics[key + "prefix_cache_hit_rate"] = grown.rate
            metrics[key + "kv_cache_usage"] = max(load.kv_cache_usage for load in loads)
            metrics[key + "running"] = float(max(load.running for load in loads))
            metrics[key + "waiting"] = float(max(load.waiting for load in loads))
        return metrics
