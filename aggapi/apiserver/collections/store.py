"""A collection's objects, their resourceVersions and a bounded history for watches.

The objects are derived (pods, events, agents' node views), so the resourceVersions
are this server's own: microseconds of wall time, strictly increasing. A watch from
a version the history still covers replays what changed after it; one older than
the history (or than the collection itself, started later) gets 410 Expired, and
clients relist, as they do with kube-apiserver. Being wall time, a version another
replica handed out means "changes since then" here too.

Readers never queue: each keeps its position in the shared history and is woken on
change; one that falls out of it gets 410 and relists. Memory is the objects plus
the history, bounded in events and in estimated bytes (``histbound.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.apiserver.collections.histbound import HISTORY_BYTES, BoundedHistory, estimate
from aggapi.status import StatusError

Obj = dict[str, Any]
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
# A watch from a version this long before its collection started gets the state as
# events (Collection.started_after): a list, then at once a watch, in microseconds.
STARTED_WITHIN_US = 10_000_000


class Clock:
    """resourceVersions: wall-clock microseconds, never repeating, never going back."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self.last = 0

    def next(self) -> int:
        self.last = max(self.last + 1, int(self._now() * 1_000_000))
        return self.last


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    obj: Obj
    prev: Obj | None  # the object before (None for ADDED): did a watcher's selector
    #                   match it? (an object leaving a selection is DELETED for it)


def parse_rv(raw: str | None) -> int | None:
    """None for "" and "0" (any version: start from the current state); 400 otherwise
    unless a non-negative integer."""
    if raw in (None, "", "0"):
        return None
    assert raw is not None
    if not raw.isdigit():
        raise StatusError(400, f"invalid resourceVersion {raw!r}: not an integer")
    return int(raw)


def expired(rv: int) -> StatusError:
    return StatusError(410, f"too old resource version: {rv}", reason="Expired")


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal but for metadata.resourceVersion."""
    def bare(o: Mapping[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in (o.get("metadata") or {}).items() if k != "resourceVersion"}
        return {**o, "metadata": meta}
    return bare(a) == bare(b)


class Collection:
    def __init__(self, clock: Clock, *, history: int = 4096,
                 history_bytes: int = HISTORY_BYTES) -> None:
        self._clock = clock
        self.objects: dict[Hashable, Obj] = {}
        self.start_rv = clock.next()
        self.rv = self.start_rv
        self._history = BoundedHistory[Event](lambda ev: estimate(ev.obj),
                                              max_events=history, max_bytes=history_bytes)
        self._changed = asyncio.Event()
        self.listeners: list[Callable[[Event], None]] = []

    def set(self, key: Hashable, obj: Obj | None) -> Event | None:
        """Store ``obj`` (None: delete); the event, or None when nothing changed."""
        old = self.objects.get(key)
        if obj is None:
            if old is None:
                return None
            del self.objects[key]
            rv, kind, obj = self._clock.next(), DELETED, dict(old)
            old = None
        else:
            if old is not None and _same(old, obj):
                return None
            rv, kind = self._clock.next(), (MODIFIED if old is not None else ADDED)
            self.objects[key] = obj
        obj["metadata"] = {**(obj.get("metadata") or {}), "resourceVersion": str(rv)}
        self.rv = rv
        ev = Event(rv, kind, obj, old)
        self._history.append(ev)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for fn in self.listeners:
            fn(ev)
        return ev

    def now_rv(self) -> int:
        """The version of the state as it is now, for a list: the clock's reading, not
        the last change's. Another replica's collection that started after that change
        (an idle one stops and starts again) still takes a watch from it; the last
        change's version would be older than that collection and get 410."""
        return self._clock.next()

    def started_after(self, rv: int) -> bool:
        """Whether ``rv`` is from at most STARTED_WITHIN before this collection started
        and nothing since has left the history: a list another replica (or this one's
        previous collection) answered a moment before this one's feed started for the
        watch that follows it. Versions are wall time, so "a moment" is measurable.
        Such a watch gets the current state as events instead of 410: kubectl get -w
        would otherwise fail whenever its watch reaches the other replica of an idle
        pair. What it cannot get is a deletion inside that moment (the object
        stays in the client's cache until it lists again)."""
        return (self.start_rv - STARTED_WITHIN_US <= rv < self.start_rv
                and not self._history.full)

    def check_rv(self, rv: int) -> None:
        """410 unless the history holds every change after ``rv``."""
        oldest = self._history[0].rv - 1 if self._history.full else self.start_rv
        if rv < oldest:
            raise expired(rv)

    def since(self, rv: int) -> list[Event]:
        """Changes after ``rv``; 410 when the history no longer has them all."""
        self.check_rv(rv)
        if not self._history or self._history[-1].rv <= rv:
            return []
        # Versions increase along the history: skip from the end backwards.
        n = 0
        for ev in reversed(self._history):
            if ev.rv <= rv:
                break
            n += 1
        return list(itertools.islice(self._history, len(self._history) - n, None))

    async def wait(self, rv: int, timeout: float) -> None:
        """Until something changes after ``rv``, or ``timeout``."""
        if self.rv > rv:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
