"""``--link-peers``: the leader keeps the nodeimagepulls collection running while it
leads, so that its link feeder (``linkfeed``) sees every node's pulls and tells the
nodes that share a link their peers, whether or not anyone lists the collection. Its
cost is that collection's: every node's view read each poll interval (within
--collection-polls-per-second), and the cluster's pods and events watched."""

from __future__ import annotations

import asyncio
import contextlib

from aggapi.apiserver.collections.feeds import NodeFeed
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.election import Election
from aggapi.apiserver.shared import Shared

CHECK_EVERY = 2.0  # seconds between looks at the leadership


class LinkHold:
    def __init__(self, feeds: Feeds, election: Election, *, enabled: bool) -> None:
        self.feeds, self.election, self.enabled = feeds, election, enabled
        self._held: Shared[str, NodeFeed] | None = None

    def check(self) -> None:
        """Hold the current term's node feed while leading; let go otherwise."""
        nodes = self.feeds.nodes
        if not self.enabled or not self.election.is_leader or nodes is None:
            self.let_go()
        elif self._held is not nodes:  # a new term made new feeds
            self.let_go()
            nodes.acquire("")
            self._held = nodes

    async def run(self) -> None:
        if not self.enabled:
            return
        try:
            while True:
                self.check()
                await asyncio.sleep(CHECK_EVERY)
        finally:
            self.let_go()

    def let_go(self) -> None:
        if self._held is not None:
            with contextlib.suppress(RuntimeError):
                self._held.release("")
            self._held = None
