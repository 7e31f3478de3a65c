"""The feeds behind the collections: pods and events (``sources``) plus the nodes'
views (``nodepolls``) turned into PodImagePull and NodeImagePull ``store``s.

One PodFeed per namespace in use ("" for all namespaces) and one NodeFeed, each
shared by every request and lingering after the last (``shared``). A change marks
the pods it touches dirty; they are rebuilt together a moment later, so a burst of
events (a rollout) costs one rebuild per pod, not one per event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Protocol

from aggapi import tasks
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.batcher import FLUSH_BATCH, Batcher
from aggapi.apiserver.collections.linkfeed import LinkFeeder
from aggapi.apiserver.collections.nodeimagepulls import node_image_pull
from aggapi.apiserver.collections.nodepolls import NodePoll
from aggapi.apiserver.collections.podimagepulls import (
    needs_node_view,
    pod_image_pull,
    reads_others,
    view_slice,
)
from aggapi.apiserver.collections.store import Clock, Collection, Event
from aggapi.apiserver.podsources import PodKey, Source, Sources, pod_key
from aggapi.apiserver.shared import Shared
from aggapi.status import StatusError

log = logging.getLogger(__name__)

FIRST_VIEWS = 2.0  # seconds a feed's first list waits for the nodes' first views
NODE_LIST_EVERY = 5.0  # seconds between reads of which nodes have an agent
SYNC_TIMEOUT = 10.0


class Feed(Protocol):
    collection: Collection

    async def ready(self) -> None: ...


async def _first_views(polls: Shared[str, NodePoll] | None, nodes: Iterable[str]) -> None:
    """Until each of ``nodes``' polls has its first view, or FIRST_VIEWS."""
    waits = [p.polled.wait() for n in nodes
             if polls is not None and (p := polls.get(n)) is not None]
    if waits:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), FIRST_VIEWS)


class PodFeed(Batcher):
    """PodImagePulls of one namespace ("" for all): one Source, and a poll of each
    node where a pod still has an image to pull."""

    def __init__(self, sources: Sources, namespace: str,
                 polls: Shared[str, NodePoll] | None, clock: Clock,
                 seed: Collection | None = None,
                 basis: Callable[[], Mapping[Hashable, Any]] | None = None) -> None:
        super().__init__()
        self.namespace = namespace
        # Warming for a term not yet started (``basis``: the mirror's objects, the
        # leader's, whose totals its builds keep): no history, no reader; ``promote``
        # makes it the term's.
        self.basis = basis
        self._sources = sources
        self.source: Source = sources.acquire(namespace)  # released by stop()
        self.polls = polls
        # Seeded (mirror.py): the old leader's objects and history, served at once.
        self.seeded = seed is not None
        if seed is not None:
            seed.adopt(clock)
        self.collection = Collection(clock) if seed is None else seed
        self.on_node: dict[str, set[PodKey]] = {}  # every pod, by node
        self._node_of: dict[PodKey, str] = {}
        self._needs: dict[str, set[PodKey]] = {}  # pods that need their node's view
        # Of those: their images, whether their object reads the other pulls, and the
        # slice of the view it was built from (a view change rebuilds only the pods
        # whose slice moved).
        self._slices: dict[PodKey, tuple[list[str], bool, Any]] = {}
        self._polled: set[str] = set()  # nodes whose poll this feed holds
        self.synced = asyncio.Event()
        # A ready() has waited for the nodes' first views (a seeded feed's state has
        # its old leader's: none to wait for).
        self._viewed = self.seeded
        self._sync: asyncio.Task[None] | None = None
        self.source.listeners.append(self._source_changed)

    def _source_changed(self, key: PodKey | None) -> None:
        self.mark(None if key is None else (key,), urgent=True)

    def start(self) -> None:
        self._sync = asyncio.create_task(self._first_sync())

    async def _first_sync(self) -> None:
        await self.source.wait_synced(timeout=None)
        self.mark(None)
        # A batch per turn of the loop: 50,000 pods built in one go held every request,
        # watch and Lease renewal of the replica for seconds.
        while True:
            self.flush(FLUSH_BATCH)
            if not self.pending:
                break
            await asyncio.sleep(0)
        self.synced.set()

    async def stop(self) -> None:
        self.cancel()
        await tasks.cancel(self._sync)
        for node in list(self._polled):
            self._unpoll(node)
        with contextlib.suppress(ValueError):
            self.source.listeners.remove(self._source_changed)
        self._sources.release(self.namespace)

    def promote(self, seed: Collection | None, clock: Clock) -> None:
        """A warmed feed becomes its term's: from ``seed`` (the mirror, the old term's
        versions kept) with only what this build sees otherwise stamped in ``clock``,
        or (no mirror) its objects at ``clock``'s first version. Synchronous: no
        change of kube's comes between the build and the diff (50,000 objects, 0.1 s).
        Not fully built yet (the hand-over's bound passed): what is built is diffed
        now, the rest of its first build goes on into the term's collection."""
        built, self.basis = self.collection.objects, None
        if seed is not None:
            seed.adopt(clock)
        col = seed if seed is not None else Collection(clock)
        for key, obj in built.items():
            col.set(key, obj, record=seed is not None)
        rest = [k for k in col.objects if k not in built]
        if self.synced.is_set():
            for key in rest:  # gone from kube
                col.set(key, None)
        else:
            self.mark(rest)  # built (or found gone) with the rest
            self._viewed = self._viewed or seed is not None
        self.collection, self.seeded = col, seed is not None

    @property
    def serving(self) -> bool:
        """Whether it holds a complete state: synced, or seeded."""
        return self.seeded or self.synced.is_set()

    async def ready(self) -> None:
        """A complete state: synced, and (the feed's first time) the first view of each
        node needed. Later, a node just polled (a rollout polls new ones all the time)
        shows kubelet's view until its agent's comes, as it does on a watch: a list
        does not wait for it. A seeded feed is ready at once: the mirrored state is
        consistent at its version, stale by the build only."""
        if self.seeded and not self.synced.is_set():
            return
        try:
            await asyncio.wait_for(self.synced.wait(), SYNC_TIMEOUT)
        except TimeoutError:
            raise StatusError(503, "timed out reading pods from the Kubernetes API",
                              retry_after=2) from None
        if not self._viewed:
            await _first_views(self.polls, self._polled)
            self._viewed = True
            self.flush()
        else:
            # kube's changes (new pods, phases) now; bytes waiting for a rebuild come
            # as changes, as kube-apiserver lists its cache without waiting for it (in
            # a rollout thousands wait: rebuilt here, each list stalled the loop).
            self.flush(urgent_only=True)

    def _newest_first(self) -> list[PodKey]:
        """Every pod's key, the one kube changed last first (its own version or its
        newest event's). A successor's term starts before its build ends (promote):
        the changes its old leader had not stamped yet are the newest, and are built
        first, not anywhere in 50,000 (a replay's Dones came up to 50 s late). Kube's
        versions order nothing else here: a version that is not a number sorts last."""
        def version(obj: Mapping[str, Any]) -> int:
            raw = (obj.get("metadata") or {}).get("resourceVersion")
            return int(raw) if isinstance(raw, str) and raw.isdigit() else 0

        newest = []
        for p in self.source.pods.items.values():
            key = pod_key(p)
            newest.append((max([version(p), *map(version, self.source.events_of(key))]),
                           key))
        newest.sort(reverse=True)
        return [key for _, key in newest]

    def _view_changed(self, node: str) -> None:
        # Only pods still pulling read the view, and of those only the ones whose part
        # of it moved (another pod's bytes do not change this pod's object).
        poll = self.polls.get(node) if self.polls is not None else None
        view = poll.view if poll is not None else None
        moved = []
        for key in self._needs.get(node, ()):
            built = self._slices.get(key)
            if built is None or view_slice(built[0], view, others=built[1]) != built[2]:
                moved.append(key)
        self.mark(moved)

    def _poll(self, node: str) -> None:
        if self.polls is None:
            return
        self._polled.add(node)
        poll = self.polls.acquire(node)
        poll.listeners.append(self._view_changed)
        if poll.polled.is_set():  # another feed's poll: its view is there already
            self.mark(set(self._needs.get(node, ())))

    def _unpoll(self, node: str) -> None:
        self._polled.discard(node)
        if self.polls is None:
            return
        poll = self.polls.get(node)
        if poll is not None:
            with contextlib.suppress(ValueError):
                poll.listeners.remove(self._view_changed)
        self.polls.release(node)

    def _index(self, key: PodKey, node: str | None, needs: bool) -> None:
        if not needs:
            self._slices.pop(key, None)
        old = self._node_of.pop(key, None)
        if old is not None:
            self.on_node.get(old, set()).discard(key)
            self._needs.get(old, set()).discard(key)
        if node is None:
            return
        self._node_of[key] = node
        self.on_node.setdefault(node, set()).add(key)
        if needs:
            self._needs.setdefault(node, set()).add(key)

    def _fire(self) -> None:
        self._timer = None
        self.flush(FLUSH_BATCH)

    def flush(self, limit: int | None = None, *, urgent_only: bool = False) -> None:
        """Rebuild the dirty pods: all of them (or only kube's changes), or ``limit`` now
        and the rest on the loop's next turns."""
        if not self.source.synced:
            return
        if self.everything:  # a relist: every pod, known or gone, behind kube's changes
            self.everything = False
            self.dirty.update(dict.fromkeys(self._newest_first()))
            self.dirty.update(dict.fromkeys(self.collection.objects))
        dirty, _ = self.take(limit, urgent_only=urgent_only)
        # The first build is not recorded in the history: no reader holds a version of
        # this collection before it is synced (ready() waits), so none watches from it.
        # A seeded one's is: its readers hold the mirrored versions. A warming one's
        # never is: none reads it before ``promote``.
        record = (self.synced.is_set() or self.seeded) and self.basis is None
        basis = self.basis() if self.basis is not None else None
        if self.pending and self._timer is None:  # the rest on the loop's next turns
            self._timer = asyncio.get_running_loop().call_later(0, self._fire)
        # Only the nodes of the pods rebuilt can gain or lose a poll: not every node's
        # at each flush (5,000 nodes, twenty flushes a second in a rollout).
        touched: set[str] = set()
        for key in dirty:
            if (old := self._node_of.get(key)) is not None:
                touched.add(old)
            pod = self.source.pod(key)
            if pod is None:
                self._index(key, None, False)
                self.collection.set(key, None, record=record)
                continue
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            poll = self.polls.get(node) if self.polls is not None and node in self._polled \
                else None
            view = poll.view if poll is not None else None
            # (the object before: a Done image keeps the bytes its pull brought)
            before = self.collection.objects.get(key)
            if before is None and basis is not None:
                before = basis.get(key)
            obj = pod_image_pull(pod, self.source.events_of(key), view, before)
            needs = needs_node_view(obj)
            if needs:
                images = [str(i.get("image") or "") for i in obj["status"]["images"]]
                others = reads_others(obj)
                self._slices[key] = (images, others, view_slice(images, view, others=others))
            self._index(key, node, needs)
            touched.add(node)
            self.collection.set(key, obj, record=record)
        for node in touched:
            if self._needs.get(node):
                if node not in self._polled:
                    self._poll(node)
            else:
                self._needs.pop(node, None)
                if node in self._polled:
                    self._unpoll(node)
            if not self.on_node.get(node):
                self.on_node.pop(node, None)


class NodeFeed(Batcher):
    """NodeImagePulls: every node with an agent, polled while anyone watches, and the
    cluster-wide PodFeed for the pods waiting on each."""

    def __init__(self, agent: AgentClient, pods: Shared[str, PodFeed],
                 polls: Shared[str, NodePoll], clock: Clock) -> None:
        super().__init__()
        self.agent, self.pods, self.polls = agent, pods, polls
        self.collection = Collection(clock)
        self._feed: PodFeed | None = None
        self._nodes: set[str] = set()
        self._listed = asyncio.Event()  # the first read of which nodes have an agent
        self._viewed = False
        self._task: asyncio.Task[None] | None = None
        # Other nodes' pulls on each node's link, told to its agent (issue 37 item 3).
        self.links = LinkFeeder(agent, polls)

    def _pod_changed(self, ev: Event) -> None:
        node = str((ev.obj.get("spec") or {}).get("nodeName") or "")
        if node in self._nodes:
            self.mark((node,))

    def start(self) -> None:
        self._feed = self.pods.acquire("")
        self._feed.collection.listeners.append(self._pod_changed)
        self._task = asyncio.create_task(self._follow_nodes())
        self.links.start()

    async def _follow_nodes(self) -> None:
        with contextlib.suppress(TimeoutError):
            await self.agent.directory.wait_synced(SYNC_TIMEOUT)
        while True:
            nodes = set(self.agent.directory.nodes())
            for node in nodes - self._nodes:
                self.polls.acquire(node).listeners.append(self._view_changed)
            for node in self._nodes - nodes:
                self._release(node)
            changed = nodes ^ self._nodes
            self._nodes = nodes
            self._listed.set()
            if changed:
                self.mark(changed)
            await asyncio.sleep(NODE_LIST_EVERY)

    def _view_changed(self, node: str) -> None:
        self.mark((node,))

    def pod_objects(self) -> Iterable[dict[str, Any]]:
        """The cluster's PodImagePulls (this feed's pod feed), as they stand."""
        return self._feed.collection.objects.values() if self._feed is not None else ()

    def _release(self, node: str) -> None:
        poll = self.polls.get(node)
        if poll is not None:
            with contextlib.suppress(ValueError):
                poll.listeners.remove(self._view_changed)
        self.polls.release(node)

    async def stop(self) -> None:
        self.cancel()
        await self.links.stop()
        await tasks.cancel(self._task)
        for node in self._nodes:
            self._release(node)
        self._nodes = set()
        if self._feed is not None:
            with contextlib.suppress(ValueError):
                self._feed.collection.listeners.remove(self._pod_changed)
            self.pods.release("")

    async def ready(self) -> None:
        assert self._feed is not None
        await self._feed.ready()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listed.wait(), SYNC_TIMEOUT)
        if not self._viewed:
            await _first_views(self.polls, self._nodes)
            self._viewed = True
        self.mark(None)
        self.flush()

    def flush(self) -> None:
        feed = self._feed
        if feed is None or not feed.synced.is_set():
            return
        dirty, everything = self.take()
        if everything:
            dirty |= self._nodes | {str(o['metadata']['name'])
                                   for o in self.collection.objects.values()}
        for node in dirty:
            if node not in self._nodes:
                self.collection.set(("", node), None)
                continue
            poll = self.polls.get(node)
            pods = [feed.collection.objects[k] for k in feed.on_node.get(node, ())
                    if k in feed.collection.objects]
            self.collection.set(("", node), node_image_pull(
                node, poll.view if poll else None, poll.error if poll else "", pods,
                self.agent.directory.created(node)))
