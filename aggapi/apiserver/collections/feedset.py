"""The collections' shared feeds as one part (built once, ``parts.py``): one PodFeed
per namespace in use ("" for all) and one NodeFeed, over the shared pod and event
sources and node polls; and the leader's terms (``new_term``), each with its own
resourceVersion clock and feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping
from typing import Any

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feeds import NodeFeed, PodFeed
from aggapi.apiserver.collections.loopbusy import LoopBusy
from aggapi.apiserver.collections.nodepolls import NodePoll
from aggapi.apiserver.collections.store import EPOCH_SHIFT, Clock, Collection
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.shared import Shared

log = logging.getLogger(__name__)

WARM_SETTLE = 10.0  # seconds after the warm feed is built before ``on_warm`` runs
# Seconds from start after which /readyz stops waiting for the collections' first build
# (pods/copy and imagepullprogress need none: a build that never ends, e.g. no right to
# list pods, must not keep them unavailable; the lists then answer 503 as before).
BUILT_WAIT = 60.0
# Node reads in flight at once, all nodes. A successor's warm build (or a cold
# leader's) starts a poll for every node with a pull under way, and each read's first
# is at once: at 50,000 pods 1,300 TLS handshakes came together, 2,300-3,200 open
# connections and +240 MiB in 9 s (s43 replay), and one turn of the loop held every
# other callback for a second (the successor noticed it was handed the Lease 3.5 s
# late). Reads at the budget's pace take 10-50 ms each: 64 at once is 1,300 a second.
READS_IN_FLIGHT = 64


class Feeds:
    """The shared feeds, built once (parts.py) and handed to the collection handlers."""

    def __init__(self, sources: Sources, agent: AgentClient | None, *, linger: float,
                 poll_interval: float, polls_per_second: float = 0.0,
                 warm: bool = False, on_warm: Callable[[], None] | None = None) -> None:
        self.clock = Clock()
        self.term: int | None = None  # the epoch of the term served (None: no election)
        self._seed: Collection | None = None  # the term's start: a mirror (mirror.py)
        # The cluster-wide pod feed warmed for this replica's next term, while the
        # leader hands over (election.py): promoted at the term's start.
        self._warm: PodFeed | None = None
        self.sources = sources
        self.agent = agent
        self.linger = linger
        self.warm, self._on_warm = warm, on_warm
        self._warming: asyncio.Task[None] | None = None
        self._held: Shared[str, PodFeed] | None = None  # the term's warm feed's owner
        # The collections were complete once: this replica's warm feed was built (with
        # its nodes' first views), or its mirror of the leader's synced (/readyz).
        self.built = asyncio.Event()
        self._started = time.monotonic()
        self.poll_interval, self.polls_per_second = poll_interval, polls_per_second
        self.polls: Shared[str, NodePoll] | None = None
        # How busy the loop is: node reads are spread further apart while it is too busy
        # (started with the first read).
        self.busy = LoopBusy()
        self.reads = asyncio.Semaphore(READS_IN_FLIGHT)
        if agent is not None:
            polls: Shared[str, NodePoll] = Shared(
                lambda node: self._node_poll(agent, node), linger=0)
            self.polls = polls
        self.pods, self.nodes = self._new_feeds()

    def _new_feeds(self) -> tuple[Shared[str, PodFeed], Shared[str, NodeFeed] | None]:
        clock, agent, node_polls = self.clock, self.agent, self.polls
        pods: Shared[str, PodFeed] = Shared(
            lambda ns: PodFeed(self.sources, ns, self.polls, clock,
                               seed=self._take_seed() if ns == "" else None),
            linger=self.linger)
        nodes: Shared[str, NodeFeed] | None = None
        if agent is not None and node_polls is not None:
            nodes = Shared(lambda _k: NodeFeed(agent, pods, node_polls, clock),
                           linger=self.linger)
        return pods, nodes

    def _take_seed(self) -> Collection | None:
        seed, self._seed = self._seed, None
        return seed

    def _node_poll(self, agent: AgentClient, node: str) -> NodePoll:
        self.busy.start()
        return NodePoll(agent, node, interval=self.poll_delay, gate=self.reads)

    def poll_delay(self) -> float:
        """Seconds between two reads of one node's agent: ``poll_interval``, or longer
        while that many nodes read that often would pass ``polls_per_second`` (0: no
        bound), times the stretch a too busy event loop asks (``loopbusy``). Each read
        is a TLS request: 5,000 nodes read every second would take more than the
        leader's whole core."""
        polled = len(self.polls) if self.polls is not None else 0
        stretch = self.busy.stretch
        if self.polls_per_second <= 0 or polled <= self.poll_interval * self.polls_per_second:
            return self.poll_interval * stretch
        pace = polled / self.polls_per_second * stretch
        return pace * (0.75 + random.random() / 2)  # spread: polls started together

    async def prepare(self, basis: Callable[[], Mapping[Hashable, Any]]) -> None:
        """Warm the cluster-wide pod feed of this replica's next term (the leader hands
        over), until its informers have listed: then it can lead. Its build of every
        object (the totals kept from ``basis``, the mirror of the leader's) and its
        nodes' first views go on, and are its term's first (``new_term``): what is
        built then is diffed against the mirror, the rest keeps the mirror's state (the
        old leader's, to its last change) until built, and kube's changes since the
        lists go first. Waiting for the whole build kept two replicas doing every
        change's work: at 50,000 pods in a rollout on two cores, the build outlasted
        the hand-over's 25 s bound in every s43 replay while the old leader went on."""
        if self._warm is None:
            self._warm = PodFeed(self.sources, "", self.polls, Clock(0), basis=basis)
            self._warm.start()
        warm, start = self._warm, time.monotonic()
        await warm.source.wait_synced(timeout=None)
        log.info("warming the next term: pods and events listed",
                 extra={"seconds": round(time.monotonic() - start, 2)})

    @property
    def warming(self) -> PodFeed | None:
        """The feed ``prepare`` warms for the next term, if any."""
        return self._warm

    async def cool(self) -> None:
        """Another replica leads: what ``prepare`` warmed is not needed."""
        warm, self._warm = self._warm, None
        if warm is not None:
            await warm.stop()

    async def new_term(self, epoch: int | None, seed: Collection | None = None) -> None:
        """Leadership changed: this replica leads from ``epoch`` on (None: it no longer
        leads). The old term's collections close (each watcher gets what it had not
        yet sent, then ends) and the next request starts the new term's feeds. With
        ``seed`` (the old leader's cluster-wide podimagepulls, mirrored here) the new
        term's cluster-wide pod feed starts from it, held for the term: its versions
        stay valid, and its first build changes only what differs. A feed warmed for
        the term (``prepare``) is its first build: the term starts with it, diffed
        against ``seed``, instead of listing and building then."""
        old_pods, old_nodes = self.pods, self.nodes
        warm, self._warm = self._warm, None
        if (ended := old_pods.get("")) is not None and self.term is not None:
            log.info("term ends", extra={"epoch": self.term,
                                         "resourceVersion": ended.collection.rv})
        self.clock, self.term = Clock(epoch), epoch
        if seed is not None and seed.rv >= self.clock.peek():  # never: epochs only grow
            log.warning("a mirror at %d is not below epoch %s: not used", seed.rv, epoch)
            seed = None
        self._seed = seed if epoch is not None else None
        hold = self._seed is not None
        self.pods, self.nodes = self._new_feeds()
        if warm is not None and epoch is not None:
            start = time.monotonic()
            built = warm.synced.is_set()
            warm.promote(self._take_seed(), self.clock)
            self.pods.put("", warm)
            hold = True
            log.info("term starts from the warm feed", extra={
                "built": built, "stamped": self.clock.peek() - (self.clock.epoch << EPOCH_SHIFT),
                "seconds": round(time.monotonic() - start, 3)})
        # The term serves from here (its epoch is set): its cluster-wide feed, holding
        # the mirrored versions, must be there before the first await below, or a
        # watch from such a version would find only a namespace's new feed: 410.
        if epoch is not None:
            self.lead(hold=hold)
        old = [*old_pods.parts().values(),
               *(old_nodes.parts().values() if old_nodes is not None else ())]
        for feed in old:
            feed.collection.close()
        if warm is not None and epoch is None:
            await warm.stop()
        if old_nodes is not None:
            await old_nodes.close()
        await old_pods.close()

    def lead(self, *, hold: bool = False) -> None:
        """This replica leads (a new term, or alone): with ``warm`` (or ``hold``: the
        term starts from a mirror), start the cluster-wide pod feed now and hold it for
        the term (its Shared closes at the next term), as kube-apiserver's watch cache
        is filled at start, not at the first list: the first list then finds every
        object built."""
        if (self.warm or hold) and self._held is not self.pods:
            feed = self.pods.acquire("")
            self._held = self.pods
            if self._warming is not None:  # the last term's: its feed is closed
                self._warming.cancel()
            self._warming = asyncio.create_task(self._built(feed))

    async def _built(self, feed: PodFeed) -> None:
        began = time.monotonic()
        await feed.synced.wait()
        await feed.ready()  # its nodes' first views: the first list need not wait
        self.built.set()
        log.info("collections built", extra={
            "objects": len(feed.collection.objects),
            "seconds": round(time.monotonic() - began, 2)})
        if self._on_warm is not None:
            # Not at once: the lists that waited for the build go first (a GC freeze at
            # 10,000 pods holds the loop ~1 s; right after the build it delayed them).
            await asyncio.sleep(WARM_SETTLE)
            self._on_warm()

    def complete(self) -> bool:
        """For /readyz: whether a first list is answered from built collections (kube-
        apiserver's readyz waits for its informers the same way): once built or
        mirrored, always (a leader change does not make replicas unready); without a
        warm feed there is nothing built at start; after BUILT_WAIT, stop waiting."""
        return (self.built.is_set() or not self.warm
                or time.monotonic() - self._started > BUILT_WAIT)

    @contextlib.asynccontextmanager
    async def pods_of(self, namespace: str, rv: int | None = None
                      ) -> AsyncIterator[PodFeed]:
        """The feed that serves ``namespace`` ("" for all): the one whose history holds
        ``rv`` (a version names one collection's history: the namespace's own and the
        cluster-wide one stamp the same change differently); else the cluster-wide one
        while it runs and is synced, else the namespace's own. Selectors scope it: the
        handler adds metadata.namespace to every namespaced request."""
        if rv is not None and namespace:
            for key in (namespace, ""):
                owner = self.pods.get(key)
                if owner is not None and owner.collection.owns(rv):
                    async with self.pods.use(key) as feed:
                        yield feed
                    return
        async with self.pods.use_covering(namespace, "", lambda f: f.serving) as feed:
            yield feed

    def watches(self) -> int:
        """Watches held on kube-apiserver for pods and events now (the collections'
        and the per-pod streams', shared)."""
        return self.sources.watches()

    def agent_polls(self) -> int:
        return len(self.polls) if self.polls is not None else 0

    async def close(self) -> None:
        await self.busy.stop()
        if self._warming is not None:
            self._warming.cancel()
        await self.cool()
        if self.nodes is not None:
            await self.nodes.close()
        await self.pods.close()
        if self.polls is not None:
            await self.polls.close()
        await self.sources.close()
