"""Fan-out of one producer's objects to any number of streaming clients.

A thousand clients following the same pod share one upstream stream from the
agent and one merge with Kubernetes state; every object is JSON-encoded once.
Memory is bounded: a reader that falls more than ``backlog`` objects behind gets
the latest object per key (a coalesced snapshot) instead of everything it missed.
CPU is bounded too: readers are woken at most once per ``linger`` seconds (the
objects of one agent poll come in a burst), so each writes a burst in one TLS
record instead of waking and writing once per object.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from aggapi import tasks

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Item:
    seq: int
    obj: Obj
    line: bytes  # the NDJSON encoding, made once for every reader
    terminal: bool


class Broadcast:
    def __init__(self, key_of: Callable[[Obj], Hashable],
                 is_terminal: Callable[[Obj], bool], backlog: int = 256,
                 linger: float = 0.0) -> None:
        self._key_of = key_of
        self._is_terminal = is_terminal
        self._ring: deque[Item] = deque(maxlen=backlog)
        self._latest: dict[Hashable, Item] = {}
        self._changed = asyncio.Event()
        self._linger = linger
        self._wake_at: asyncio.TimerHandle | None = None
        self.seq = 0
        self.closed = False

    def publish(self, obj: Obj) -> None:
        if self.closed:
            return
        self.seq += 1
        terminal = self._is_terminal(obj)
        item = Item(self.seq, obj, json.dumps(obj, separators=(",", ":")).encode() + b"\n",
                    terminal)
        self._ring.append(item)
        self._latest[("terminal",) if terminal else self._key_of(obj)] = item
        self.closed = terminal
        if terminal or self._linger <= 0:
            self._wake()
        elif self._wake_at is None:
            self._wake_at = asyncio.get_running_loop().call_later(self._linger, self._wake)

    def _wake(self) -> None:
        if self._wake_at is not None:
            self._wake_at.cancel()
            self._wake_at = None
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def finish(self) -> None:
        """No more objects (the producer ended without a final one)."""
        self.closed = True
        self._wake()

    def drained(self, since: int) -> bool:
        """A reader at ``since`` has everything and nothing more will come."""
        return self.closed and since >= self.seq

    def _since(self, since: int) -> list[Item]:
        if self._ring and since >= self._ring[0].seq - 1:
            # seqs in the ring are consecutive: skip to the first one after ``since``.
            return list(itertools.islice(self._ring, since - self._ring[0].seq + 1, None))
        # New reader, or one that fell out of the ring: the latest state per key.
        return sorted((i for i in self._latest.values() if i.seq > since),
                      key=lambda i: i.seq)

    async def read(self, since: int, timeout: float | None) -> list[Item]:
        """Items after ``since`` (waiting up to ``timeout`` for one); [] on timeout."""
        items = self._since(since)
        if not items and not self.closed:
            # Nothing new yet (a new reader before the first object, too): wait.
            # asyncio.timeout, not wait_for: no extra task per reader per wake-up.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()
            items = self._since(since)
        return items


Producer = Callable[[Broadcast], Coroutine[Any, Any, None]]


class _Entry:
    def __init__(self, broadcast: Broadcast, task: asyncio.Task[None]) -> None:
        self.broadcast = broadcast
        self.task = task
        self.refs = 0


class SharedStreams:
    """key -> one running producer and its Broadcast, while anyone reads it."""

    def __init__(self, *, key_of: Callable[[Obj], Hashable],
                 is_terminal: Callable[[Obj], bool],
                 on_crash: Callable[[BaseException], Obj], backlog: int = 256,
                 linger: float = 0.0) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self._key_of, self._is_terminal = key_of, is_terminal
        self._on_crash = on_crash
        self._backlog, self._linger = backlog, linger

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.asynccontextmanager
    async def join(self, key: Hashable, producer: Producer) -> AsyncIterator[Broadcast]:
        entry = self._entries.get(key)
        if entry is None or entry.broadcast.closed:
            bc = Broadcast(self._key_of, self._is_terminal, self._backlog, self._linger)
            entry = _Entry(bc, asyncio.create_task(self._run(producer, bc)))
            self._entries[key] = entry
        entry.refs += 1
        try:
            yield entry.broadcast
        finally:
            entry.refs -= 1
            if entry.refs == 0:
                if self._entries.get(key) is entry:
                    del self._entries[key]
                await tasks.cancel(entry.task)

    async def _run(self, producer: Producer, bc: Broadcast) -> None:
        try:
            await producer(bc)
            bc.finish()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # readers must end with a final object, never hang
            log.exception("shared stream producer failed")
            bc.publish(self._on_crash(exc))
            bc.finish()

    async def close(self) -> None:
        entries, self._entries = list(self._entries.values()), {}
        for e in entries:
            e.task.cancel()
        for e in entries:
            with contextlib.suppress(asyncio.CancelledError):
                await e.task
