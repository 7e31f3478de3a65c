"""Graceful shutdown: stop accepting, let streams finish for a grace period, then
tell them to end (``SHUTDOWN`` event) so they can write a final object and return.

Sequence on SIGTERM (aiohttp's runner.cleanup drives it): the listening sockets
close and idle keep-alive connections are dropped; our on_shutdown hook marks the
server draining (/readyz fails) and waits up to ``grace`` for open streams; then
sets ``SHUTDOWN``; the runner waits ``final`` seconds more and cancels what is left.
Copies in flight drain meanwhile as the agent's do (aggapi/serve/drain.py): one that
cannot finish within ``grace`` at its rate ends at once with a retryable 503, so its
client sends it again through another replica instead of into this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from aggapi.apiserver.metrics import Metrics
from aggapi.serve.drain import Drain

log = logging.getLogger(__name__)


class Lifecycle:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.draining = asyncio.Event()
        self.shutdown = asyncio.Event()
        self.streams = 0
        # Seconds of the shutdown grace already spent handing the leadership over
        # (main.py): the drain gets the rest, so the whole stays within the pod's
        # terminationGracePeriodSeconds.
        self.grace_spent = 0.0
        self.copies = Drain()
        self._idle = asyncio.Event()
        self._idle.set()

    def stream_started(self) -> None:
        self.streams += 1
        self._idle.clear()

    def stream_ended(self) -> None:
        self.streams -= 1
        if self.streams <= 0:
            self._idle.set()

    async def drain(self, grace: float) -> None:
        grace = max(0.0, grace - self.grace_spent)
        self.draining.set()
        start = time.monotonic()
        self.copies.start(grace)
        if self.streams:
            log.info("draining streams", extra={"streams": self.streams, "graceSeconds": grace})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        await self.copies.idle()
        left = self.streams
        self.shutdown.set()
        log.info("shutdown signalled", extra={"streamsLeft": left,
                                              "drainedSeconds": round(time.monotonic() - start, 3)})

    @contextlib.asynccontextmanager
    async def track(self, label: str) -> AsyncIterator[asyncio.Event]:
        """Wrap a streaming response (``label``: its subresource). Yields the SHUTDOWN
        event: when it is set, write a final object and return. Counts the stream in
        metrics and for draining."""
        gauge = self.metrics.streams.labels(label)
        gauge.inc()
        self.stream_started()
        try:
            yield self.shutdown
        finally:
            self.stream_ended()
            gauge.dec()
