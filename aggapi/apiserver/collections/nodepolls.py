"""One poll of a node's agent serves every pod followed on that node.

The agent's node view (``/v1/imagepulls``: every in-flight pull with its bytes,
rate and phase, and kubelet's pull slots) is read once per ``interval`` while any
feed is interested in the node, whatever the number of pods or clients. It is the
same endpoint nodes/imagepulls and the per-pod stream's slot check read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from aggapi import tasks
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.imagepullprogress.nodeview import fetch_node_view
from aggapi.status import StatusError

log = logging.getLogger(__name__)

# Who the agent's audit log names for the shared polls (no one user asked for them).
POLL_SUBJECT = "aggapi:collections"


def _bare(view: dict[str, Any] | None) -> dict[str, Any] | None:
    # linkTicks move every tick while layers download: the link judgement reads them
    # from the latest view; they change nothing a collection shows.
    return None if view is None else {k: v for k, v in view.items()
                                      if k not in ("time", "linkTicks")}


class NodePoll:
    """The latest node view of one node (None until read, or while unreadable).
    ``interval``: seconds between reads, or a function giving them (the feeds' pace).
    ``gate``: shared by every node's poll, bounds the reads in flight at once."""

    def __init__(self, agent: AgentClient, node: str, *,
                 interval: float | Callable[[], float],
                 gate: asyncio.Semaphore | None = None) -> None:
        self.agent, self.node, self.interval = agent, node, interval
        self.gate = gate
        self.view: dict[str, Any] | None = None
        self.read_at = 0.0  # time.monotonic() of the last read
        self.error = ""
        self.polled = asyncio.Event()  # one answer (or failure) came
        self.listeners: list[Callable[[str], None]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"nodepoll:{self.node}")

    async def stop(self) -> None:
        await tasks.cancel(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            try:
                async with self.gate or contextlib.nullcontext():
                    view: dict[str, Any] | None = await fetch_node_view(
                        self.agent, self.node, POLL_SUBJECT, reuse=True)
                error = ""
            except StatusError as exc:
                view, error = None, exc.message
            except Exception as exc:  # an agent hiccup must not end the poll
                log.warning("node view of %s: %r", self.node, exc)
                view, error = None, repr(exc)
            changed = _bare(view) != _bare(self.view) or error != self.error
            self.view, self.error, self.read_at = view, error, time.monotonic()
            self.polled.set()
            if changed:
                for fn in self.listeners:
                    fn(self.node)
            await asyncio.sleep(self.delay())

    def delay(self) -> float:
        """Seconds until the next read."""
        if not callable(self.interval):
            return self.interval
        return self.interval()
