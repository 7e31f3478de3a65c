"""A minimum transfer rate for copies, so a slot cannot be held by a client that trickles.

An idle timeout alone resets on every piece: an upload sending 1 B/s, or a download
whose client reads nothing (its writes wait on a full socket buffer), would hold a
copy slot for ever. As kubelet's streaming timeouts and nginx's ``send_timeout``, a
copy must move ``min_rate * window`` bytes within every ``window`` seconds spent
waiting for its client; else it is cut (an upload gets a 408 Status, a download's
connection is aborted, since its status line is gone). Only time spent waiting on the
client counts: the agent's own disk and worker time never makes a client too slow.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import StreamReader, web

from aggapi.serve.site import IdleTimeoutBody, body_stalled
from aggapi.status import StatusError

log = logging.getLogger(__name__)


class MinRate:
    """Waiting time and bytes since the last ``min_rate * window`` bytes were moved."""

    def __init__(self, min_rate: int, window: float) -> None:
        self.min_rate = min_rate
        self.window = window
        self.need = min_rate * window
        self.waited = 0.0
        self.moved = 0

    def budget(self) -> float | None:
        """Seconds the next wait may take, or None without a minimum."""
        if self.min_rate <= 0 or self.window <= 0:
            return None
        return max(0.0, self.window - self.waited)

    def add(self, n: int, waited: float) -> bool:
        """Count ``n`` bytes moved after ``waited`` s; False once the client is too slow."""
        self.moved += n
        self.waited += waited
        if self.moved >= self.need:
            self.moved, self.waited = 0, 0.0
            return True
        return self.budget() != 0.0

    def too_slow(self, what: str) -> StatusError:
        return StatusError(408, f"{what} moved fewer than {self.min_rate} bytes/s over "
                           f"{self.window:g} s: aborted", reason="Timeout")


class PacedBody(IdleTimeoutBody):
    """An upload body (:class:`aggapi.serve.site.IdleTimeoutBody`) that is also cut, with a
    408, when the client sends slower than the minimum rate."""

    def __init__(self, body: StreamReader, idle: float, rate: MinRate) -> None:
        super().__init__(body, idle)
        self.rate = rate

    async def _next_piece(self) -> bytes:
        if getattr(self.body, "_buffer", None):  # already here: no wait, no timer
            data, boundary = await self.body.readchunk()
            if data or not boundary:
                self.rate.add(len(data), 0.0)
                return data
        budget = self.rate.budget()
        idle = self.idle if self.idle > 0 else None
        limit = budget if idle is None or (budget is not None and budget < idle) else idle
        start = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                while True:
                    data, boundary = await self.body.readchunk()
                    if data or not boundary:
                        break
        except TimeoutError:
            self.stalled = (body_stalled(self.idle) if limit == idle
                            else self.rate.too_slow("the upload"))
            raise self.stalled from None
        if not self.rate.add(len(data), time.monotonic() - start) and data:
            self.stalled = self.rate.too_slow("the upload")
            raise self.stalled
        return data


PACE: web.RequestKey[MinRate] = web.RequestKey("copy_min_rate", MinRate)


async def paced_write(request: web.Request, resp: web.StreamResponse, chunk: bytes) -> None:
    """``resp.write(chunk)``, the connection cut if the client reads too slowly
    (``request[PACE]``, when set): a write waits while the client's socket is full."""
    rate = request.get(PACE)
    budget = rate.budget() if rate is not None else None
    if rate is None or budget is None:
        await resp.write(chunk)
        return
    start = time.monotonic()
    try:
        async with asyncio.timeout(budget):
            await resp.write(chunk)
    except TimeoutError:
        pass
    else:
        if rate.add(len(chunk), time.monotonic() - start):
            return
    log.warning("copy %s aborted: %s", request.path_qs, rate.too_slow("the download").message)
    if request.transport is not None:
        request.transport.abort()
    raise ConnectionResetError("download client too slow")
