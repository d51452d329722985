"""Micro-batching for concurrent games: every game awaits its own call to a shared service (a partner
model, an embedder), and the calls made in the same event-loop pass run as one batch (one `generate`,
one embedding call), the way a vLLM server batches concurrent HTTP requests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

X = TypeVar("X")
Y = TypeVar("Y")

# Passes of the event loop to wait before a flush: games do a little synchronous work (parsing)
# between resuming and calling in, so one pass can miss the slower ones.
_SETTLE_PASSES = 3


class MicroBatcher(Generic[X, Y]):
    """`await batcher(x)` -> `y`, with all calls pending in the same loop pass sent to `fn` together."""

    def __init__(self, fn: Callable[[Sequence[X]], Awaitable[list[Y]]]) -> None:
        self._fn = fn
        self._pending: list[tuple[X, asyncio.Future[Y]]] = []
        self._flush: asyncio.Task[None] | None = None
        self.batch_sizes: list[int] = []

    async def __call__(self, item: X) -> Y:
        future: asyncio.Future[Y] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._flush is None:
            self._flush = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        for _ in range(_SETTLE_PASSES):
            await asyncio.sleep(0)
        batch, self._pending, self._flush = self._pending, [], None
        self.batch_sizes.append(len(batch))
        try:
            results = await self._fn([item for item, _ in batch])
            assert len(results) == len(batch), (len(results), len(batch))
        except Exception as err:  # every caller sees the failure, none hangs
            for _, future in batch:
                future.set_exception(err)
            return
        for (_, future), result in zip(batch, results, strict=True):
            future.set_result(result)
