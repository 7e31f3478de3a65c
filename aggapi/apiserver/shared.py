"""Ref-counted, lingering shared parts: started by their first user, stopped
``linger`` seconds after their last one left (a `kubectl get` then `kubectl get -w`
finds the part warm, and an idle server holds nothing)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from typing import Generic, Protocol, TypeVar


class Part(Protocol):
    def start(self) -> None: ...
    async def stop(self) -> None: ...


K = TypeVar("K", bound=Hashable)
P = TypeVar("P", bound=Part)


class _Entry(Generic[P]):
    def __init__(self, part: P) -> None:
        self.part = part
        self.refs = 0
        self.stop_at: asyncio.TimerHandle | None = None


class Shared(Generic[K, P]):
    def __init__(self, make: Callable[[K], P], *, linger: float) -> None:
        self._make = make
        self.linger = linger
        self._entries: dict[K, _Entry[P]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def acquire(self, key: K) -> P:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry(self._make(key))
            entry.part.start()
        if entry.stop_at is not None:
            entry.stop_at.cancel()
            entry.stop_at = None
        entry.refs += 1
        return entry.part

    def put(self, key: K, part: P) -> None:
        """Share ``part``, already started elsewhere, as ``key``'s (none yet): its first
        user acquires it."""
        assert key not in self._entries
        self._entries[key] = _Entry(part)

    def release(self, key: K) -> None:
        entry = self._entries.get(key)
        if entry is None:
            return
        entry.refs -= 1
        if entry.refs > 0:
            return
        if self.linger <= 0:
            self._expire(key, entry)
        else:
            entry.stop_at = asyncio.get_running_loop().call_later(
                self.linger, self._expire, key, entry)

    def _expire(self, key: K, entry: _Entry[P]) -> None:
        if entry.refs == 0 and self._entries.get(key) is entry:
            del self._entries[key]
            self._spawn(entry.part.stop())

    def _spawn(self, stop: Awaitable[None]) -> None:
        async def run() -> None:
            await stop
        task = asyncio.ensure_future(run())
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    @contextlib.asynccontextmanager
    async def use(self, key: K) -> AsyncIterator[P]:
        part = self.acquire(key)
        try:
            yield part
        finally:
            self.release(key)

    @contextlib.asynccontextmanager
    async def use_covering(self, key: K, wider: K,
                           ready: Callable[[P], bool]) -> AsyncIterator[P]:
        """``use`` of ``wider``'s part while it runs and is ``ready`` (it holds ``key``'s
        objects too, as kube-apiserver's watch cache serves every namespace from one
        watch: no second part, no cold start), else of ``key``'s own."""
        part = self.get(wider)
        async with self.use(wider if part is not None and ready(part) else key) as used:
            yield used

    def get(self, key: K) -> P | None:
        entry = self._entries.get(key)
        return entry.part if entry is not None else None

    def parts(self) -> dict[K, P]:
        return {k: e.part for k, e in self._entries.items()}

    def __len__(self) -> int:
        """How many parts run (no copy: each of 5,000 node polls asks, each time)."""
        return len(self._entries)

    async def close(self) -> None:
        entries, self._entries = list(self._entries.values()), {}
        for e in entries:
            if e.stop_at is not None:
                e.stop_at.cancel()
        await asyncio.gather(*(e.part.stop() for e in entries), *self._stopping)
