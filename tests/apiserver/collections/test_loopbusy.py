"""A leader whose event loop is too busy reads the nodes' views less often (bytes can
wait, kube's phases should not), and at its pace again once the loop frees up."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aggapi.apiserver.collections import loopbusy
from aggapi.apiserver.collections.loopbusy import (
    MAX_STRETCH,
    TARGET,
    LoopBusy,
    next_stretch,
)
from tests.framework.until import until

from .fakes import budgeted_feeds


class Clocks:
    """A loop thread's CPU time and the wall clock, moved by the test."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0

    def run(self, seconds: float, busy: float) -> None:
        self.wall += seconds
        self.cpu += seconds * busy


def _meter() -> tuple[LoopBusy, Clocks]:
    c = Clocks()
    return LoopBusy(thread_clock=lambda: c.cpu, wall_clock=lambda: c.wall), c


def test_the_stretch_follows_the_busy_share_within_its_bounds() -> None:
    assert next_stretch(1.0, TARGET) == 1.0
    assert next_stretch(1.0, 0.2) == 1.0  # never below the budget's pace
    assert next_stretch(2.0, 0.95) > 2.0
    assert next_stretch(MAX_STRETCH, 1.0) == MAX_STRETCH
    assert next_stretch(4.0, 0.3) < 4.0


def test_a_loop_kept_busy_spreads_the_reads_and_a_freed_one_returns_to_its_pace() -> None:
    meter, clocks = _meter()
    meter.sample()
    for _ in range(30):  # 30 s at 97%: as the replay's leader before the roll
        clocks.run(1.0, 0.97)
        meter.sample()
    assert meter.busy > 0.9 and meter.stretch == MAX_STRETCH
    for _ in range(30):  # the reads spread out: the loop at 40%
        clocks.run(1.0, 0.4)
        meter.sample()
    assert meter.busy < 0.5 and meter.stretch == 1.0


def test_a_loop_at_its_target_keeps_the_pace() -> None:
    meter, clocks = _meter()
    meter.sample()
    for _ in range(60):
        clocks.run(1.0, TARGET)
        meter.sample()
    assert meter.stretch == 1.0


async def test_the_node_reads_take_the_stretch() -> None:
    feeds = budgeted_feeds(100)
    assert feeds.polls is not None
    try:
        feeds.polls.acquire("n0")  # the first read starts the meter
        assert feeds.busy._task is not None
        assert feeds.poll_delay() == 1.0
        feeds.busy.stretch = 4.0
        assert feeds.poll_delay() == 4.0  # within the budget: the interval, stretched
        for i in range(1, 1000):
            feeds.polls.acquire(f"n{i}")
        # over it: 1,000 nodes at 100 reads/s is every 10 s, stretched to 40 (+-25%)
        assert all(30 <= feeds.poll_delay() <= 50 for _ in range(100))
    finally:
        await feeds.close()
    assert feeds.busy._task is None


def test_a_loop_whose_callbacks_wait_counts_as_busy_whatever_its_cpu() -> None:
    """Starved by other processes, the loop's thread is on the CPU only part of the
    time, yet callbacks queue: the lag makes it busy, and the reads spread out."""
    meter, clocks = _meter()
    meter.sample()
    for _ in range(30):
        clocks.run(1.0, 0.6)  # the CPU share alone: below the target
        meter.lag = 0.1
        meter.sample()
    assert meter.busy > 0.9 and meter.stretch == MAX_STRETCH
    for _ in range(30):
        clocks.run(1.0, 0.6)
        meter.lag = 0.01
        meter.sample()
    assert meter.stretch == 1.0


async def test_the_probe_measures_how_long_a_callback_waits(monkeypatch: Any) -> None:
    monkeypatch.setattr(loopbusy, "EVERY", 0.05)
    meter = LoopBusy(thread_clock=lambda: 0.0)  # no CPU share: only the lag counts
    seen: list[float] = []
    sample = meter.sample

    def recorded() -> None:
        sample()
        seen.append(meter.busy)
    meter.sample = recorded  # type: ignore[method-assign]
    meter.start()
    try:
        await until(lambda: len(seen) >= 3)
        assert max(seen) < 0.1  # an idle loop
        loop = asyncio.get_running_loop()
        for _ in range(30):  # callbacks holding the loop 10 ms each, ahead of the probe
            loop.call_soon(time.sleep, 0.01)
        count = len(seen)
        await until(lambda: len(seen) >= count + 3)
        assert max(seen[count:]) > 0.4
    finally:
        await meter.stop()
