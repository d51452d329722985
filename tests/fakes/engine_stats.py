"""The fake vLLM server's /metrics page: vLLM 0.33's prefix-cache counters and load gauges, under their
names and labels (tests/fixtures/vllm_metrics_hybrid.txt is the real engine's page), kept as the
engine keeps them (v1/core/kv_cache_manager.py, `get_computed_blocks`): a request looks up its prompt,
less the last token, which is always computed, in whole blocks cached under its model (the base, or an
adapter's name and path, as vLLM keys its blocks); every prompt token counts as queried, those of the
blocks found as hits; the whole blocks of its prompt and reply are cached as it ends, so G rollouts of
one prompt and a multi-turn episode's later turns hit.

The fake serves one request at a time (its lock): one running, the others waiting, and the KV cache
holding the running request's blocks. A request is one HTTP request, whatever its prompts and `n`."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

BLOCK_SIZE = 16
NUM_BLOCKS = 4096

_HELP = {
    "vllm:num_requests_running": ("gauge", "Number of requests in model execution batches."),
    "vllm:num_requests_waiting": ("gauge", "Number of requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:prefix_cache_queries_total": (
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    "vllm:prefix_cache_hits_total": ("counter", "Prefix cache hits, in terms of number of cached tokens."),
}


class EngineStats:
    def __init__(self, block_size: int = BLOCK_SIZE, num_blocks: int = NUM_BLOCKS) -> None:
        self.block_size, self.num_blocks = block_size, num_blocks
        self.queries = self.hits = 0
        self.running = self.waiting = 0
        self.blocks_in_use = 0
        self._cached: set[int] = set()
        self._guard = threading.Lock()

    @contextmanager
    def request(self, lock: AbstractContextManager) -> Iterator[None]:
        """A generation request: waiting until it holds `lock`, running while it does."""
        with self._guard:
            self.waiting += 1
        with lock:
            with self._guard:
                self.waiting -= 1
                self.running += 1
            try:
                yield
            finally:
                with self._guard:
                    self.running -= 1
                    self.blocks_in_use = 0

    def _blocks(self, model: str, ids: Sequence[int], count: int) -> list[int]:
        """The chained hashes of the first `count` whole blocks of `ids`, as vLLM's block hashes chain."""
        hashes, parent = [], hash(model)
        for block in range(count):
            parent = hash((parent, tuple(ids[block * self.block_size : (block + 1) * self.block_size])))
            hashes.append(parent)
        return hashes

    def prefill(self, model: str, prompt: Sequence[int]) -> None:
        """One prompt looked up in the cache and its blocks held while the request runs."""
        hit = 0
        for block in self._blocks(model, prompt, (len(prompt) - 1) // self.block_size):
            if block not in self._cached:
                break
            hit += 1
        with self._guard:
            self.queries += len(prompt)
            self.hits += hit * self.block_size
            self.blocks_in_use += -(-len(prompt) // self.block_size)

    def cache(self, model: str, ids: Sequence[int]) -> None:
        """A finished sequence's (prompt and reply) whole blocks, for later requests to hit."""
        self._cached.update(self._blocks(model, ids, len(ids) // self.block_size))

    def page(self, model_name: str) -> str:
        with self._guard:
            values = {
                "vllm:num_requests_running": self.running,
                "vllm:num_requests_waiting": self.waiting,
                "vllm:kv_cache_usage_perc": min(self.blocks_in_use / self.num_blocks, 1.0),
                "vllm:prefix_cache_queries_total": self.queries,
                "vllm:prefix_cache_hits_total": self.hits,
            }
        lines = []
        for name, value in values.items():
            kind, text = _HELP[name]
            lines += [
                f"# HELP {name} {text}",
                f"# TYPE {name} {kind}",
                f'{name}{{engine="0",model_name="{model_name}"}} {float(value)}',
            ]
        return "\n".join(lines) + "\n"
