"""The leader tells each node the other nodes' pulls on its link (issue 37 item 3).

Runs beside the NodeImagePulls feed, which polls every node's view: after each round
of views, ``LinkShare`` judges per registry host whether the nodes pulling from it share
one link, and each node it names gets its peers by PUT /v1/linkpeers, signed as every
call to an agent (capability for that node, operation ``linkpeers``). Sent every round:
the agent keeps the word three seconds only. A failed send is logged and dropped; the
next round sends afresh.

One slow agent must not make the others' words late: a round waits for its sends at
most half a round, the rest run on (one at a time per node: a node whose last send is
still out is skipped), and a send ends after ``SEND_TIMEOUT`` (a word that late is
stale; the client itself has no total timeout, its streams being long-lived).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Callable

from aggapi import tasks
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.linkshare import LinkShare
from aggapi.apiserver.collections.nodepolls import POLL_SUBJECT, NodePoll
from aggapi.apiserver.shared import Shared
from aggapi.linkpeers import PeerLink, unparse
from aggapi.status import StatusError
from aggapi.wire import AGENT_LINK_PEERS_PATH, OP_LINK_PEERS

log = logging.getLogger(__name__)

EVERY = 1.0  # seconds between rounds (the agent keeps the word 3 s)
AT_ONCE = 16  # sends in flight at once
SEND_TIMEOUT = 2.0  # seconds a send may take (the agent keeps a word TTL = 3 s)


class LinkFeeder:
    def __init__(self, agent: AgentClient, polls: Shared[str, NodePoll], *,
                 every: float = EVERY, clock: Callable[[], float] = time.monotonic) -> None:
        self.agent, self.polls, self.every, self.clock = agent, polls, every, clock
        self.share = LinkShare()
        self._gate = asyncio.Semaphore(AT_ONCE)
        self._task: asyncio.Task[None] | None = None
        self._telling: set[str] = set()
        self._sending: dict[str, asyncio.Task[None]] = {}  # node -> its send still out

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="linkfeeder")

    async def stop(self) -> None:
        await tasks.cancel(self._task)
        self._task = None
        for t in list(self._sending.values()):
            await tasks.cancel(t)
        self._sending.clear()

    async def round(self) -> dict[str, PeerLink]:
        """One judgement over the latest views, and its sends; what was told."""
        polls = self.polls.parts()
        views = {node: poll.view for node, poll in polls.items()}
        # A view is up to a poll interval old: its pulls' bytes left are counted down
        # (``clock`` is the polls' time.monotonic()).
        now = self.clock()
        told = self.share.observe(now, views, {node: now - poll.read_at
                                               for node, poll in polls.items()})
        if set(told) != self._telling:  # once per change (the rounds come each second)
            self._telling = set(told)
            log.info("link peers: telling %s", ", ".join(
                f"{n} ({len(link.peers)} peers, total {link.total or 0:.0f} B/s)"
                for n, link in sorted(told.items())) or "no node")
        sent = []
        for n, link in told.items():
            if n not in self._sending:  # its last word still out: this one waits
                t = self._sending[n] = asyncio.create_task(self._send(n, link))
                t.add_done_callback(functools.partial(self._sent, n))
                sent.append(t)
        if sent:
            await asyncio.wait(sent, timeout=self.every / 2)
        return told

    def _sent(self, node: str, _: asyncio.Task[None]) -> None:
        self._sending.pop(node, None)

    async def _send(self, node: str, link: PeerLink) -> None:
        try:
            async with asyncio.timeout(SEND_TIMEOUT):
                await self.send(node, link)
        except TimeoutError:
            log.debug("link peers to %s: no answer within %.0f s", node, SEND_TIMEOUT)
        except Exception as exc:  # nobody awaits this task: say it here
            log.warning("link peers to %s: %r", node, exc)

    async def _run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception as exc:  # a bad round must not end the feed
                log.warning("link peers round: %r", exc)
            await asyncio.sleep(self.every)

    async def send(self, node: str, link: PeerLink) -> None:
        async with self._gate:
            try:
                resp = await self.agent.open(
                    "PUT", AGENT_LINK_PEERS_PATH, node=node, subject=POLL_SUBJECT,
                    operation=OP_LINK_PEERS, data=json.dumps(unparse(link)).encode(),
                    headers={"Content-Type": "application/json"})
                resp.release()
            except StatusError as exc:  # an older agent (404), or one not reachable
                log.debug("link peers to %s: %s", node, exc.message)
