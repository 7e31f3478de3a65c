"""A collection's objects, their resourceVersions and a bounded history for watches.

The objects are derived (pods, events, agents' node views), so the resourceVersions
are this server's own. One replica computes the collections at a time (the leader,
``election.py``; the others forward to it, ``replicas.py``), so there is one history.
A version is ``epoch << 32 | sequence``: the epoch is the leader's term (a new
leader's is higher), the sequence counts the term's changes. A version names exactly
one point of one collection's history: a watch or a page from it replays what changed
after it; one this collection did not hand out (another term's that its mirror did
not have, ``mirror.py``; a collection stopped since; one older than the history) gets
410 Expired and clients relist, as they do with kube-apiserver; one from the future
waits, then 504 "Too large resource version". A term that starts from a mirror of the
last one holds that term's versions and history (``adopt``).

Readers never queue: each keeps its position in the shared history and is woken on
change; one that falls out of it gets 410 and relists. Memory is the objects plus
the history, bounded in events and in estimated bytes (``histbound.py``).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import operator
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggapi.apiserver.collections.histbound import (
    HISTORY_BYTES,
    HISTORY_EVENTS,
    BoundedHistory,
    encode,
    weight,
)
from aggapi.status import StatusError

Obj = dict[str, Any]
ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
EPOCH_SHIFT = 32  # 4 billion changes per term
# Seconds a request with a version from the future waits for it, as kube-apiserver
# waits for its watch cache before answering "Too large resource version".
TOO_LARGE_WAIT = 3.0
# Paged lists' states kept for their later pages (as kube-apiserver's watch cache keeps
# snapshots for continue tokens): during a 10,000-pod rollout the history's 4,096
# changes cover a few seconds, less than kubectl get -A takes to page through 500 at a
# time, so every continue was 410 and kubectl get -A -w exited. Each is a shallow copy
# (the objects are shared: stored objects are replaced, never changed); at most
# SNAPSHOTS, each dropped SNAPSHOT_SECONDS after its last page. Each keeps one sorted
# selection (a list of references) for its later pages: sorting 50,000 objects again
# for each page of 500 held the loop ~0.6 s a page.
SNAPSHOTS = 16
SNAPSHOT_SECONDS = 60.0


class Clock:
    """The resourceVersions of one term: ``epoch << EPOCH_SHIFT | sequence``."""

    def __init__(self, epoch: int | None = None) -> None:
        # Without an election (one replica): the start time in seconds, above every
        # version a previous run of this replica handed out.
        self.epoch = int(time.time()) if epoch is None else epoch
        self.last = self.epoch << EPOCH_SHIFT

    def next(self) -> int:
        self.last += 1
        return self.last

    def peek(self) -> int:
        """The latest version handed out."""
        return self.last


@dataclass(frozen=True)
class Event:
    rv: int
    type: str
    obj: Obj
    prev: Obj | None  # the object before (None for ADDED): did a watcher's selector
    #                   match it? (an object leaving a selection is DELETED for it)
    #                   and what undoing the change restores (Collection.state_at)
    key: Hashable = None
    # The object's JSON, encoded once when the history takes the event (weighed with
    # it) for every plain watcher's line (watch.py): the followers' mirrors and the
    # clients all send each change. Empty for an event the history does not keep.
    text: bytes = field(default=b"", compare=False, repr=False)


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


def too_large(rv: int, current: int) -> StatusError:
    """kube-apiserver's answer to a version it has not reached after waiting for it
    (k8s.io/apiserver storage.NewTooLargeResourceVersionError): client-go's reflector
    recognises it by the cause and retries."""
    return StatusError(
        504, f"Timeout: Too large resource version: {rv}, current: {current}",
        reason="Timeout", retry_after=1,
        details={"causes": [{"reason": "ResourceVersionTooLarge",
                             "message": "Too large resource version"}]})


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Equal but for metadata.resourceVersion."""
    def bare(o: Mapping[str, Any]) -> dict[str, Any]:
        meta = {k: v for k, v in (o.get("metadata") or {}).items() if k != "resourceVersion"}
        return {**o, "metadata": meta}
    return bare(a) == bare(b)


@dataclass
class Kept:
    """A paged list's state at one version, and the last selection a page sorted."""
    used: float
    state: dict[Hashable, Obj]
    order: tuple[Hashable, list[Obj]] | None = None


class Collection:
    def __init__(self, clock: Clock, *, history: int | None = None,
                 history_bytes: int | None = None) -> None:
        history = HISTORY_EVENTS if history is None else history
        history_bytes = HISTORY_BYTES if history_bytes is None else history_bytes
        self._clock = clock
        self.objects: dict[Hashable, Obj] = {}
        self.start_rv = clock.next()
        self.rv = self.start_rv
        self._history = BoundedHistory[Event](lambda ev: weight(ev.text),
                                              max_events=history, max_bytes=history_bytes)
        self._rvs: set[int] = {self.start_rv}  # the versions it can serve from
        self.closed = False
        self._snapshots: OrderedDict[int, Kept] = OrderedDict()
        self._changed = asyncio.Event()
        self.listeners: list[Callable[[Event], None]] = []

    def set(self, key: Hashable, obj: Obj | None, *, record: bool = True) -> Event | None:
        """Store ``obj`` (None: delete); the event, or None when nothing changed.
        ``record=False``: the change is not kept in the history, so no earlier version
        can be watched or paged from any more (only this one on): for a feed's first
        build, before any reader can hold a version of it. 50,000 ADDED events were
        weighed (a JSON encode each) only to be evicted by the next 4,096."""
        old = self.objects.get(key)
        if obj is None:
            if old is None:
                return None
            del self.objects[key]
            rv, kind, obj = self._clock.next(), DELETED, dict(old)
        else:
            if old is not None and _same(old, obj):
                return None
            rv, kind = self._clock.next(), (MODIFIED if old is not None else ADDED)
            self.objects[key] = obj
        obj["metadata"] = {**(obj.get("metadata") or {}), "resourceVersion": str(rv)}
        ev = Event(rv, kind, obj, old, key, encode(obj) if record else b"")
        if not record:  # the collection starts again from here
            self._history.clear()
            self.start_rv, self._rvs = rv, {rv}
        self._record(ev, history=record)
        return ev

    def _record(self, ev: Event, *, history: bool = True) -> None:
        self.rv = ev.rv
        if history:
            # An evicted change's version no longer names a point whose later changes
            # are all known here (nor does the start's, once any change left).
            for gone in self._history.append(ev):
                self._rvs.discard(gone.rv)
                self._rvs.discard(self.start_rv)
            self._rvs.add(ev.rv)
        self._wake()
        for fn in self.listeners:
            fn(ev)

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # A follower's mirror of the leader's collection (``mirror.py``): the leader's own
    # objects and versions, and a history bounded as the leader's; handed to this
    # replica's next term when it leads, so its clients' versions stay valid.

    def reset(self, objects: dict[Hashable, Obj], rv: int) -> None:
        """The leader's state at its version ``rv``: the history starts again there."""
        self.objects = objects
        self._history.clear()
        self.start_rv = self.rv = rv
        self._rvs = {rv}
        self._snapshots.clear()
        self._wake()

    def apply(self, kind: str, key: Hashable, obj: Obj, rv: int) -> None:
        """The leader's change ``kind`` of ``key`` at its version ``rv`` (above all
        held: the leader's watch sends them in order)."""
        old = self.objects.get(key)
        if kind == DELETED:
            self.objects.pop(key, None)
        else:
            self.objects[key] = obj
        self._record(Event(rv, kind, obj, old, key, encode(obj)))

    def adopt(self, clock: Clock) -> None:
        """This replica leads from here: its term's ``clock`` stamps the changes that
        follow, every one above the mirrored versions (a later epoch). The mirrored
        state is kept at its last version, the one every client the old term ended
        holds (as a paged list's): the term's first build may change more objects than
        the history holds (a leader that lagged kube by 10,000 changes), and a watch
        from it then gets each object's net change (``net_since``), not 410."""
        assert clock.peek() > self.rv, "a new term's versions follow the mirrored ones"
        self._clock = clock
        self.keep_state(self.rv, self.objects)

    def reached(self, rv: int) -> bool:
        """Whether ``rv`` is not from the future: not above this term's last version
        (nor from a later term: this replica may be a leader that has not yet learnt
        it was replaced)."""
        return rv <= self._clock.peek()

    async def wait_reached(self, rv: int, timeout: float | None = None) -> None:
        """Until this term's versions reach ``rv``, at most TOO_LARGE_WAIT s as
        kube-apiserver waits for its watch cache; then 504 Too large."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (TOO_LARGE_WAIT if timeout is None else timeout)
        while not self.reached(rv):
            left = deadline - loop.time()
            if left <= 0:
                raise too_large(rv, self.rv)
            await asyncio.sleep(min(left, 0.05))

    def keep_state(self, rv: int, state: Mapping[Hashable, Obj]) -> None:
        """Keep ``state`` (the objects at ``rv``) for a paged list's later pages."""
        now = time.monotonic()
        self._drop_snapshots(now)
        if rv in self._snapshots:
            self._snapshots[rv].used = now
            self._snapshots.move_to_end(rv)
            return
        self._snapshots[rv] = Kept(now, dict(state))
        while len(self._snapshots) > SNAPSHOTS:
            self._snapshots.popitem(last=False)

    def kept_order(self, rv: int, selection: Hashable) -> list[Obj] | None:
        """The objects at ``rv`` that ``selection`` matches, in page order, if a page
        of that list sorted them."""
        kept = None if self.closed else self._snapshots.get(rv)
        if kept is None or kept.order is None or kept.order[0] != selection:
            return None
        return kept.order[1]

    def keep_order(self, rv: int, selection: Hashable, objs: list[Obj]) -> None:
        """Keep a paged list's sorted selection beside its state (one per state: a
        later page then bisects instead of sorting the whole state again)."""
        kept = self._snapshots.get(rv)
        if kept is not None:
            kept.order = (selection, objs)

    def _drop_snapshots(self, now: float) -> None:
        for rv in [rv for rv, kept in self._snapshots.items()
                   if now - kept.used > SNAPSHOT_SECONDS]:
            del self._snapshots[rv]

    def state_at(self, rv: int) -> dict[Hashable, Obj]:
        """The objects as they were at ``rv``: a paged list's kept state, else the
        current ones with every later change undone (each event keeps the object
        before it). 410 unless one of them has it (never for another term's version:
        a closed collection keeps nothing). Read-only: the kept state is shared."""
        self._drop_snapshots(time.monotonic())
        kept = None if self.closed else self._snapshots.get(rv)
        if kept is not None:
            return kept.state
        state = dict(self.objects)
        for ev in reversed(self.since(rv)):
            if ev.prev is None:
                state.pop(ev.key, None)
            else:
                state[ev.key] = ev.prev
        return state

    def net_since(self, rv: int) -> tuple[list[Event], int]:
        """For a watch from ``rv`` that the history no longer covers, but a paged list's
        kept state at ``rv`` does (kubectl get -w and informers list in pages, then
        watch from the first page's version; during a rollout the history can roll
        past it while the pages are read): each object's net change since ``rv``, one
        event per changed object, and the version they bring the watcher to. It ends
        where replaying every change would have, without the steps between. 410 when
        no kept state has ``rv``."""
        self._drop_snapshots(time.monotonic())
        kept = None if self.closed else self._snapshots.get(rv)
        if kept is None:
            raise expired(rv)
        before, now = kept.state, self.rv
        out = [Event(int(obj["metadata"]["resourceVersion"]),
                     ADDED if old is None else MODIFIED, obj, old, key)
               for key, obj in self.objects.items()
               if (old := before.get(key)) is not obj]
        out.sort(key=lambda ev: ev.rv)
        for key, old in before.items():
            if key not in self.objects:
                gone = {**old, "metadata": {**(old.get("metadata") or {}),
                                            "resourceVersion": str(now)}}
                out.append(Event(now, DELETED, gone, old, key))
        return out, now

    def close(self) -> None:
        """This term is over (leadership lost): each watcher gets the changes it has
        not yet sent (``final``) and ends; it resumes from its last version on the next
        leader, whose mirror of this history continues it (or answers 410)."""
        self.closed = True
        self._snapshots.clear()
        self._wake()

    def owns(self, rv: int) -> bool:
        return not self.closed and rv in self._rvs

    def check_rv(self, rv: int) -> None:
        """410 unless ``rv`` is a version this collection handed out (its start, or a
        change the history still holds): only then is "every change after it" known
        here. Another term's version, or a stopped collection's, is never served."""
        if not self.owns(rv):
            raise expired(rv)

    def since(self, rv: int, limit: int | None = None) -> list[Event]:
        """Changes after ``rv`` (the first ``limit`` of them); 410 when the history no
        longer has them all."""
        self.check_rv(rv)
        return self._after(rv, limit)

    def final(self, rv: int) -> list[Event]:
        """Changes after ``rv`` for a watch that ends, this term closed or not: a
        watcher ending at a leader change sends what it has not yet sent (the next
        leader's mirror has them too). 410 when the history no longer has them all."""
        if rv not in self._rvs:
            raise expired(rv)
        return self._after(rv)

    def _after(self, rv: int, limit: int | None = None) -> list[Event]:
        h = self._history
        if not h or h[-1].rv <= rv:
            return []
        # Versions increase along the history: the first change after ``rv`` by
        # bisection, then only the changes taken. (Walking the deque was O(history) per
        # call: each watcher's every wake-up, and a watcher thousands behind took its
        # catch-up 256 at a time, each time walking all of them: ~3% of the leader.)
        lo = bisect.bisect_right(h, rv, key=operator.attrgetter("rv"))
        end = len(h) if limit is None else min(len(h), lo + limit)
        return [h[i] for i in range(lo, end)]

    async def wait(self, rv: int, timeout: float) -> None:
        """Until something changes after ``rv``, or ``timeout``."""
        if self.rv > rv:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
