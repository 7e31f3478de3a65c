"""How busy the leader's event loop is, and how much to stretch its node reads for it.

At 5,000 nodes the leader's loop was ~95% busy before any leader change (s42 py-spy
of the replay): node reads a third of it, and kube's changes (phases, a pull's end)
queued behind them, seconds late and growing. Bytes can wait, phases should not: while
the loop is busier than ``TARGET``, the node reads are spread further apart (at most
``MAX_STRETCH`` times), and back to the poll interval as it frees up.

Two measures, sampled every ``EVERY`` s on the loop itself, the larger counting: the
loop thread's own CPU time over wall time (``time.thread_time``; blind to the worker
threads, whose encoding does not hold the loop), and the loop's lag, how long a
callback waits for its turn (``LAG_FULL`` counts as fully busy). The CPU share alone
missed a loop starved by other processes on the machine: at 50,000 pods (s43 replay)
the leader's thread had CPU 62-77% of the time while its ready callbacks never ran
out (py-spy: 94% of samples outside the poll), phases queued behind node reads for
seconds, and the followers' mirror streams fell out of its history.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aggapi import tasks

log = logging.getLogger(__name__)

EVERY = 1.0  # seconds between samples
TARGET = 0.75  # the loop's busy share above which node reads are spread further apart
MAX_STRETCH = 4.0  # at most this many times the budget's pace
SMOOTH = 0.5  # weight of the newest sample in the busy share (an EWMA)
LAG_FULL = 0.1  # seconds a callback waits for its turn that count as a fully busy loop


def next_stretch(stretch: float, busy: float) -> float:
    """The stretch after a sample: up by the busy share's excess over TARGET (a loop
    at 95% spreads reads ~27% further each second), down the same way as it frees up,
    never below 1 or above MAX_STRETCH."""
    return min(MAX_STRETCH, max(1.0, stretch * busy / TARGET))


class LoopBusy:
    """The loop's busy share (smoothed) and the stretch it asks of the node reads.
    ``thread_clock``/``wall_clock``: injectable for tests."""

    def __init__(self, *, thread_clock: Callable[[], float] = time.thread_time,
                 wall_clock: Callable[[], float] = time.monotonic) -> None:
        self._thread, self._wall = thread_clock, wall_clock
        self.busy = 0.0
        self.stretch = 1.0
        self.lag = 0.0  # seconds the last probe waited for its turn
        self._last: tuple[float, float] | None = None
        self._task: asyncio.Task[None] | None = None

    def sample(self) -> None:
        """One sample (on the loop's thread)."""
        now = (self._thread(), self._wall())
        if self._last is not None and now[1] > self._last[1]:
            share = max((now[0] - self._last[0]) / (now[1] - self._last[1]),
                        self.lag / LAG_FULL)
            share = min(1.0, share)
            self.busy = SMOOTH * share + (1 - SMOOTH) * self.busy
            before, self.stretch = self.stretch, next_stretch(self.stretch, self.busy)
            if (before == 1.0) != (self.stretch == 1.0):
                log.info("event loop %s: node reads %s", f"{self.busy:.0%} busy",
                         "spread further apart" if self.stretch > 1 else "at their pace")
        self._last = now

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loopbusy")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            # The lag: a yield waits for every callback ready before it, and a sleep's
            # wake-up is late by the callbacks then queued (the larger of the two).
            at = loop.time()
            await asyncio.sleep(0)
            self.lag = max(self.lag, loop.time() - at)
            self.sample()
            self.lag = 0.0
            at = loop.time() + EVERY
            await asyncio.sleep(EVERY)
            self.lag = max(0.0, loop.time() - at)

    async def stop(self) -> None:
        await tasks.cancel(self._task)
        self._task = None
