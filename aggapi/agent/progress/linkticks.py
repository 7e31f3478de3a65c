"""containerd's received bytes read at wall-clock ticks, for the leader to tell one
shared link from links of their own while nodes pull (issue 37 item 3).

Every ``TICK`` s of the wall clock (the same instants on every node whose clock is set)
the agent reads the bytes containerd has received (``sockbytes``) and keeps the last
``KEEP``; the node view (``GET /v1/imagepulls``) shows them as ``linkTicks``:
``[[tick wall seconds, bytes so far], ...]``. The leader compares the nodes' bytes per
tick (``aggapi.apiserver.collections.linkcov``): on one link they move against each
other. It needs the ticks themselves: two agents polling on their own phases blur the
movement that tells (measured: notes s39/linkcov).

Read only while both hold: the node view was asked for within ``WANTED`` s (the leader
polls it each second while it tells link peers) and the node downloads layers
(``active``); otherwise nothing is read and the kept ticks are dropped. A read that
ends more than ``OFF_TICK`` s after its tick is not kept (it would say another moment).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

TICK = 0.25  # seconds (aggapi.apiserver.collections.linkcov reads ticks of this size)
KEEP = 32  # ticks kept: 8 s, the leader judges the last 5
WANTED = 5.0  # seconds the node view's last request keeps the reads going
OFF_TICK = 0.02  # seconds a read may end after its tick


class LinkTicks:
    def __init__(self, read: Callable[[], int | None], active: Callable[[], bool], *,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.read, self.active, self.clock, self.sleep = read, active, clock, sleep
        self.ticks: deque[tuple[float, int]] = deque(maxlen=KEEP)
        self.wanted_at = -math.inf

    def want(self) -> None:
        """The node view was asked for: keep reading."""
        self.wanted_at = self.clock()

    def view(self) -> list[list[float]]:
        return [[round(t, 3), n] for t, n in self.ticks]

    async def step(self) -> None:
        """Wait for the next tick, then read at it (or drop the ticks if not wanted)."""
        now = self.clock()
        await self.sleep(TICK - now % TICK)
        tick = round(self.clock() / TICK) * TICK
        if tick - self.wanted_at > WANTED or not self.active():
            self.ticks.clear()
            return
        n = await asyncio.to_thread(self.read)
        if n is None:
            self.ticks.clear()
        elif self.clock() - tick <= OFF_TICK:
            self.ticks.append((tick, n))

    async def run(self) -> None:
        while True:
            await self.step()
