"""Node reads have a budget (``--collection-polls-per-second``): below it each node
with a followed pull is read every poll interval; above it each is read less often,
so that all the reads together stay within it (at 5,000 nodes a read of each every
second would take more than the leader's core)."""

from __future__ import annotations

import asyncio
from statistics import mean
from typing import Any, cast

import pytest

from aggapi.apiserver.collections import feedset
from aggapi.apiserver.config import parse_args
from tests.framework.until import until

from .fakes import FakeAgent, budgeted_feeds


async def test_reads_of_all_nodes_together_stay_within_the_budget() -> None:
    feeds = budgeted_feeds(100)
    assert feeds.polls is not None
    try:
        for i in range(100):
            feeds.polls.acquire(f"n{i}")
        assert {feeds.polls.get(f"n{i}").delay() for i in range(100)} == {1.0}  # type: ignore[union-attr]
        for i in range(100, 1000):
            feeds.polls.acquire(f"n{i}")
        delays = [feeds.polls.get(f"n{i}").delay() for i in range(1000)]  # type: ignore[union-attr]
        # 1,000 nodes within 100 reads/s: each about every 10 s, spread so that polls
        # started together do not stay in step.
        assert all(7.5 <= d <= 12.5 for d in delays) and len(set(delays)) > 900
        assert 1000 / mean(delays) <= 110
    finally:
        await feeds.close()


def test_the_budget_is_a_flag_and_zero_means_none() -> None:
    assert parse_args([]).collection_polls_per_second == 500.0
    assert parse_args(["--collection-polls-per-second=0"]).collection_polls_per_second == 0
    feeds = budgeted_feeds(0)
    assert feeds.poll_delay() == 1.0


async def test_reads_in_flight_at_once_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm build starts a poll for each node with a pull (1,300 at 50,000 pods) and
    each reads at once: the reads in flight stay within READS_IN_FLIGHT, and every node
    is still read."""
    monkeypatch.setattr(feedset, "READS_IN_FLIGHT", 8)
    feeds = budgeted_feeds(0)
    agent = cast(FakeAgent, feeds.agent)
    flight = {"now": 0, "most": 0}
    opened = agent.open

    async def slow(method: str, path: str, *, node: str, **kw: Any) -> Any:
        flight["now"] += 1
        flight["most"] = max(flight["most"], flight["now"])
        await asyncio.sleep(0.01)
        flight["now"] -= 1
        return await opened(method, path, node=node, **kw)
    agent.open = slow  # type: ignore[method-assign]
    assert feeds.polls is not None
    try:
        polls = [feeds.polls.acquire(f"n{i}") for i in range(100)]
        for p in polls:
            p.start()
        await until(lambda: all(p.polled.is_set() for p in polls))
        assert flight["most"] == 8
    finally:
        await feeds.close()
