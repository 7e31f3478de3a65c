"""A bounded TTL cache with request coalescing, for TokenReview and SAR results."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class TTLCache(Generic[V]):
    """LRU-bounded; each entry carries its own expiry. Concurrent misses for one
    key share a single lookup, so a burst of identical requests costs one review."""

    def __init__(self, maxsize: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.maxsize = maxsize
        self.clock = clock
        self._data: OrderedDict[Hashable, tuple[float, V]] = OrderedDict()
        self._inflight: dict[Hashable, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Hashable) -> V | None:
        item = self._data.get(key)
        if item is None:
            return None
        expires, value = item
        if expires <= self.clock():
            del self._data[key]
            return None
        self._data.move_to_end(key)
        return value

    def put(self, key: Hashable, value: V, ttl: float) -> None:
        if ttl <= 0 or self.maxsize <= 0:
            return
        self._data[key] = (self.clock() + ttl, value)
        self._data.move_to_end(key)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)

    def clear(self) -> None:
        self._data.clear()

    async def get_or_load(self, key: Hashable, load: Callable[[], Awaitable[V]],
                          ttl_of: Callable[[V], float]) -> tuple[V, bool]:
        """(value, was_cached). Exceptions of ``load`` are not cached.

        The lookup runs as its own task so a caller that goes away (client
        disconnect) does not cancel it for the others waiting on it.
        """
        value = self.get(key)
        if value is not None:
            return value, True
        task = self._inflight.get(key)
        shared = task is not None
        if task is None:
            task = asyncio.ensure_future(load())
            self._inflight[key] = task
            task.add_done_callback(lambda t: self._settle(key, t, ttl_of))
        return await asyncio.shield(task), shared

    def _settle(self, key: Hashable, task: asyncio.Future[V],
                ttl_of: Callable[[V], float]) -> None:
        self._inflight.pop(key, None)
        if not task.cancelled() and task.exception() is None:
            value = task.result()
            self.put(key, value, ttl_of(value))
