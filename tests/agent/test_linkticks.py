"""containerd's received bytes read at wall-clock ticks (aggapi/agent/progress/linkticks.py):
read at the tick instants only while the node view is asked for and layers download;
a late read is not kept. A fake clock: the sleeps move it, nothing waits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from aggapi.agent.progress import linkticks
from aggapi.agent.progress.linkticks import LinkTicks


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t
        self.read_takes = 0.001

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.t += s


def _ticks(clock: Clock, counts: Callable[[], int | None], active: bool = True
           ) -> LinkTicks:
    def read() -> int | None:
        clock.t += clock.read_takes
        return counts()
    return LinkTicks(read, lambda: active, clock=clock, sleep=clock.sleep)


def test_reads_land_on_the_wall_clock_ticks() -> None:
    clock = Clock(1000.07)
    n = iter(range(0, 10**6, 1000))
    lt = _ticks(clock, lambda: next(n))
    lt.want()

    async def steps() -> None:
        for _ in range(6):
            await lt.step()
    asyncio.run(steps())
    assert [t for t, _ in lt.view()] == [1000.25, 1000.5, 1000.75, 1001.0, 1001.25, 1001.5]
    assert [b for _, b in lt.view()] == [0, 1000, 2000, 3000, 4000, 5000]


def test_only_the_last_ticks_are_kept() -> None:
    clock = Clock(0.0)
    lt = _ticks(clock, lambda: 1)

    async def steps() -> None:
        for _ in range(linkticks.KEEP + 10):
            lt.want()
            await lt.step()
    asyncio.run(steps())
    assert len(lt.view()) == linkticks.KEEP


@pytest.mark.parametrize("why", ["not asked", "not downloading", "unreadable"])
def test_nothing_is_read_or_kept_when_it_would_say_nothing(why: str) -> None:
    clock = Clock(0.0)
    reads = []

    def count() -> int | None:
        reads.append(clock.t)
        return None if why == "unreadable" else 5
    lt = _ticks(clock, count, active=why != "not downloading")
    if why != "not asked":
        lt.want()
    asyncio.run(lt.step())
    assert lt.view() == []
    assert reads == ([] if why != "unreadable" else [pytest.approx(0.25, abs=0.01)])


def test_the_view_not_asked_for_a_while_stops_the_reads_and_drops_the_ticks() -> None:
    clock = Clock(0.0)
    lt = _ticks(clock, lambda: 7)
    lt.want()

    async def steps(k: int) -> None:
        for _ in range(k):
            await lt.step()
    asyncio.run(steps(4))
    assert len(lt.view()) == 4
    asyncio.run(steps(int(linkticks.WANTED / linkticks.TICK) + 1))
    assert lt.view() == []


def test_a_read_that_ends_late_is_not_kept() -> None:
    clock = Clock(0.0)
    clock.read_takes = linkticks.OFF_TICK * 2
    lt = _ticks(clock, lambda: 9)
    lt.want()
    asyncio.run(lt.step())
    assert lt.view() == []
