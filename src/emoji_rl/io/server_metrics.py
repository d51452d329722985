"""What a vLLM server says of itself on its /metrics page (Prometheus' text format): the prefix-cache
counters `make bench` and each GRPO step read, the cache config, and the load a step logs beside them
(KV-cache usage, requests running and waiting). Names and meanings are vLLM 0.33's
(v1/metrics/loggers.py, `PrometheusStatLogger`); every metric has one sample per engine (label
`engine`: a data-parallel replica) and served name.

vLLM serves the page without a key: only /v1 and a few other paths are guarded
(entrypoints/serve/middleware/authenticate.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from emoji_rl.errors import UserError
from emoji_rl.io.endpoint import Endpoint, request, request_sync

PREFIX_CACHE_METRICS = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")
"""The prefix-cache counters, in prompt tokens: those a new request looked up and those it found
cached (counters named `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits`, which
prometheus_client exposes with the suffix `_total`)."""
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
"""The share of the engine's KV-cache blocks in use, 0 to 1 despite the name; blocks that only hold
prefixes cached for later requests count as free."""
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
"""Requests in the engine's batch, and those queued for room in it (a request with `n` > 1 is n)."""
_SAMPLE = re.compile(r"(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(?P<value>\S+)(?:\s+\S+)?")
"""One sample line of the Prometheus text format: `name{labels} value [timestamp]`. Label values may
hold spaces and braces (`vllm:cache_config_info` carries the cache config's fields as labels), so the
labels end at the last `}` before the value."""


def _samples(metrics: str, names: Sequence[str]) -> dict[str, list[float]]:
    """The values of each of `names` on the page, one per sample; a `UserError` naming those it lacks,
    as a page not vLLM's does."""
    found: dict[str, list[float]] = {name: [] for name in names}
    for line in metrics.splitlines():
        sample = _SAMPLE.fullmatch(line.strip())
        if sample and sample["name"] in found:
            found[sample["name"]].append(float(sample["value"]))
    missing = [name for name in names if not found[name]]
    if missing:
        raise UserError(
            f"no {' or '.join(missing)} on the metrics page: is it a vLLM 0.33 server's /metrics?"
        )
    return found


@dataclass(frozen=True)
class PrefixCache:
    """A server's prefix-cache counters, summed over its engines."""

    queries: int
    hits: int

    @property
    def rate(self) -> float:
        """Hits over queries: the share of looked-up prompt tokens the server did not compute."""
        return self.hits / self.queries if self.queries else 0.0

    def __sub__(self, earlier: PrefixCache) -> PrefixCache:
        """What the counters grew by since `earlier`: the requests served in between."""
        return PrefixCache(self.queries - earlier.queries, self.hits - earlier.hits)


def prefix_cache_counters(metrics: str) -> PrefixCache:
    """The prefix-cache counters of a server's /metrics page, summed over its samples."""
    return _counters(_samples(metrics, PREFIX_CACHE_METRICS))


def _counters(found: dict[str, list[float]]) -> PrefixCache:
    queries, hits = (round(sum(found[name])) for name in PREFIX_CACHE_METRICS)
    return PrefixCache(queries, hits)


@dataclass(frozen=True)
class ServerLoad:
    """One reading of a server: its prefix-cache counters, its KV-cache usage (the mean of its
    engines', each holding a cache of its own) and its requests running and waiting (all engines')."""

    prefix_cache: PrefixCache
    kv_cache_usage: float
    running: int
    waiting: int


def server_load(metrics: str) -> ServerLoad:
    """A server's /metrics page as a `ServerLoad`."""
    found = _samples(metrics, [*PREFIX_CACHE_METRICS, KV_CACHE_USAGE, RUNNING, WAITING])
    usage = found[KV_CACHE_USAGE]
    return ServerLoad(
        _counters(found),
        sum(usage) / len(usage),
        round(sum(found[RUNNING])),
        round(sum(found[WAITING])),
    )


CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""vLLM's cache config as the labels of one gauge on /metrics (`CacheConfig.metrics_info`), among them
`block_size` (the attention block the engine settled on, a hybrid model's alignment included) and
`prefix_match_unit`."""
_LABEL = re.compile(r'(?P<key>[A-Za-z_][A-Za-z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def cache_config(metrics: str) -> dict[str, str]:
    """The labels of the first `vllm:cache_config_info` sample of a /metrics page ({} without one)."""
    for line in metrics.splitlines():
        if line.startswith(CACHE_CONFIG_INFO + "{"):
            return {m["key"]: m["value"] for m in _LABEL.finditer(line)}
    return {}


def read_metrics(endpoint: Endpoint) -> str:
    """The server's /metrics page."""
    with httpx.Client(timeout=endpoint.timeout_s) as client:
        return request_sync(client, endpoint, "GET", "/metrics").text


async def read_load(client: httpx.AsyncClient, endpoint: Endpoint) -> ServerLoad:
    """The server's `ServerLoad` now, for callers in an event loop (a GRPO step's rollouts)."""
    return server_load((await request(client, endpoint, "GET", "/metrics")).text)


def read_prefix_cache(endpoint: Endpoint) -> PrefixCache:
    """The server's prefix-cache counters now."""
    return prefix_cache_counters(read_metrics(endpoint))
