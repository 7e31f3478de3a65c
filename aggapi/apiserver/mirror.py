"""A follower's mirror of the leader's cluster-wide podimagepulls, so that a leader
change does not cost every client a relist.

While another replica leads, this one watches the leader's collection (every
namespace) over the forwarder's pinned, authenticated channel, with bookmarks, and
keeps the objects and the history with the leader's own versions, bounded as the
leader's (``store.Collection``: ``reset``/``apply``). It holds built objects only:
no pod informers, no agent polls, no watch on kube-apiserver.

When this replica leads (``term_listener``), its new term starts from the mirror:
the collection is handed over with the new term's clock (``Collection.adopt``), so a
client holding any version the mirror has watches on with no 410, lists answer at
once from the mirrored state, and the term's first build is diffed against it (only
real differences become changes, stamped in the new epoch). A version the mirror
never got (the old leader stamped it, its last events never came) is 410 as before.
A leader that shuts down closes its term before it drains, and sends each stream the
changes it had not yet sent before ending it (``watch.py``), so the mirror of a
graceful roll ends at the old term's last change. Before that it hands over
(election.py): the follower that succeeds it warms its term's feed beside the
mirror (``succession``), so the term starts from both at once.

nodeimagepulls is not mirrored: its watch would keep the leader polling every
agent for as long as followers exist; its watchers relist (5,000 nodes, not 50,000
pods) after a leader change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

from aggapi import GROUP_VERSION, tasks
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.collections.store import ADDED, Clock, Collection
from aggapi.apiserver.election import Election, Leader
from aggapi.apiserver.handover import Succession
from aggapi.apiserver.podsources import pod_key
from aggapi.apiserver.replicas import Forwarder

log = logging.getLogger(__name__)

# One stream for an hour: each reconnect is a gap in which the old leader's last
# changes may be sent to its clients and not to the mirror (their versions then 410).
PATH = (f"/apis/{GROUP_VERSION}/podimagepulls?watch=true&allowWatchBookmarks=true"
        "&timeoutSeconds=3600")
INITIAL = "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# Seconds a new leader waits for its mirror's stream from the old leader to end (a
# graceful leader ends it right after its term's last change; a lost one never does).
SETTLE = 2.0
RETRY = 0.5  # seconds between attempts while the leader does not answer
Obj = dict[str, Any]


def _parse(lines: bytes) -> list[Obj]:
    """Watch events, one JSON object a line; parsed as one array so that the parser's
    key memo is shared by the batch (the keys of 50,000 objects stored once a batch,
    not once an object)."""
    parts = [line for line in lines.split(b"\n") if line.strip()]
    return json.loads(b"[" + b",".join(parts) + b"]") if parts else []


async def _batches(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The stream's complete lines as they come, several at a time."""
    rest = b""
    async for chunk in resp.content.iter_any():
        rest += chunk
        cut = rest.rfind(b"\n")
        if cut >= 0:
            yield rest[:cut]
            rest = rest[cut + 1:]


class Mirror:
    def __init__(self, forwarder: Forwarder, election: Election,
                 on_synced: Callable[[], None] | None = None) -> None:
        self.forwarder, self.election = forwarder, election
        # After each sync (the process's GC freeze, as after a leader's build: 50,000
        # mirrored objects scanned at every full collection stalled the follower for
        # as long as the leader's history lasts, and the mirror fell out of it).
        self._on_synced = on_synced
        self.collection = Collection(Clock(0))
        self.synced = False  # the collection holds the leader's state at some version
        self._following = ""  # the leader's identity
        self._task: asyncio.Task[None] | None = None
        self._ended = asyncio.Event()  # no stream open now
        self._ended.set()

    def follow(self, leader: Leader | None) -> None:
        """Mirror ``leader``'s collection (None: nobody's), from the version held; its
        address is read from the election at each attempt."""
        identity = leader.identity if leader is not None else ""
        if identity == self._following and self._task is not None:
            return
        if self._task is not None:
            self._task.cancel()
        self._following, self._task = identity, None
        if identity:
            self._task = asyncio.create_task(self._run(identity), name="mirror")

    async def take(self, settle: float = SETTLE) -> Collection | None:
        """Stop mirroring and hand the mirrored collection over (this replica leads
        now): after the stream from the old leader ends, at most ``settle`` s. None
        when it holds no state."""
        start = time.monotonic()
        if self._task is not None and not self._ended.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ended.wait(), settle)
        ended = self._ended.is_set()
        await tasks.cancel(self._task)
        col, synced = self.collection, self.synced
        log.info("mirror taken for the term", extra={
            "resourceVersion": col.rv, "synced": synced, "streamEnded": ended,
            "waitedSeconds": round(time.monotonic() - start, 3)})
        self._task, self._following = None, ""
        self.collection, self.synced = Collection(Clock(0)), False
        return col if synced else None

    async def close(self) -> None:
        await tasks.cancel(self._task)
        self._task = None

    async def _run(self, identity: str) -> None:
        while True:
            started = time.monotonic()
            leader = self.election.leader
            try:
                changed = leader is not None and leader.identity == identity \
                    and not self.election.is_leader and await self._stream(leader)
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                log.info("mirror of %s: %s", identity, exc)
                changed = False
            if not changed or time.monotonic() - started < RETRY:
                await asyncio.sleep(RETRY)

    async def _stream(self, leader: Leader) -> bool:
        """One watch on the leader, from the version held (or its state first); whether
        it brought anything."""
        col = self.collection
        path = PATH + (f"&resourceVersion={col.rv}" if self.synced else INITIAL)
        async with self.forwarder.open(leader, path) as resp:
            if resp.status == 410:
                self._lost()
                return False
            if resp.status != 200:
                log.info("mirror of %s: %d", leader.identity, resp.status)
                return False
            self._ended.clear()
            try:
                return await self._follow(resp, col)
            finally:
                self._ended.set()

    async def _follow(self, resp: aiohttp.ClientResponse, col: Collection) -> bool:
        initial: dict[Any, Obj] | None = None if self.synced else {}
        changed = False
        async for lines in _batches(resp):
            for ev in await asyncio.to_thread(_parse, lines):
                kind, obj = str(ev.get("type")), ev.get("object") or {}
                meta = obj.get("metadata") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        self._lost()
                    return changed
                rv = int(meta.get("resourceVersion") or 0)
                if kind == "BOOKMARK":
                    if initial is not None and INITIAL_EVENTS_END in (
                            meta.get("annotations") or {}):
                        col.reset(initial, rv)
                        log.info("mirror synced", extra={"objects": len(initial),
                                                         "resourceVersion": rv})
                        initial, self.synced, changed = None, True, True
                        if self._on_synced is not None:
                            self._on_synced()
                elif initial is not None:
                    if kind == ADDED:
                        initial[pod_key(obj)] = obj
                elif rv > col.rv:  # never one already held
                    col.apply(kind, pod_key(obj), obj, rv)
                    changed = True
        return changed

    def _lost(self) -> None:
        """The leader's history no longer has the version held: its state again."""
        log.info("mirror fell out of the leader's history: syncing again",
                 extra={"resourceVersion": self.collection.rv})
        self.synced = False
        self.collection.reset({}, 0)


def term_listener(election: Election, feeds: Feeds, mirror: Mirror | None
                  ) -> Callable[[], Awaitable[None]]:
    """The election's listener: a new term of the feeds when this replica leads, from
    its mirror; else the mirror follows the new leader."""
    async def changed() -> None:
        if election.is_leader:
            seed = await mirror.take() if mirror is not None else None
            await feeds.new_term(election.epoch, seed=seed)
            return
        await feeds.new_term(None)
        if mirror is not None:
            mirror.follow(election.leader)
    return changed


def succession(feeds: Feeds, mirror: Mirror) -> Succession:
    """How this follower succeeds a leader that hands over (election.py): once its
    mirror holds the leader's state, warm its next term's cluster-wide feed, whose
    builds keep the mirrored objects' totals."""
    return Succession(able=lambda: mirror.synced,
                      warm=lambda: feeds.prepare(lambda: mirror.collection.objects),
                      cool=feeds.cool)
