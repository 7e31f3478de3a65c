"""Broadcast / SharedStreams: ordering, coalescing, lingering wake-ups, crash handling."""

from __future__ import annotations

import asyncio
from typing import Any

from aggapi.apiserver.imagepullprogress.fanout import Broadcast, SharedStreams


def _bc(backlog: int = 256, linger: float = 0.0) -> Broadcast:
    return Broadcast(lambda o: o["k"], lambda o: o.get("end", False), backlog, linger)


async def test_a_reader_gets_every_object_in_order() -> None:
    bc = _bc()
    for i in range(5):
        bc.publish({"k": i % 2, "i": i})
    # A new reader gets the latest object per key; one at seq N everything after N.
    assert [i.obj["i"] for i in await bc.read(-1, 0)] == [3, 4]
    later = await bc.read(1, 0)
    assert [i.obj["i"] for i in later] == [1, 2, 3, 4]
    assert later[0].line == b'{"k":1,"i":1}\n'


async def test_a_reader_that_fell_behind_gets_the_latest_per_key() -> None:
    bc = _bc(backlog=4)
    for i in range(20):
        bc.publish({"k": i % 3, "i": i})
    items = await bc.read(1, 0)
    assert [i.obj["i"] for i in items] == [17, 18, 19]


async def test_linger_wakes_a_waiting_reader_once_for_a_burst() -> None:
    bc = _bc(linger=0.05)
    loop = asyncio.get_running_loop()
    reader = asyncio.ensure_future(bc.read(0, 5))
    await asyncio.sleep(0)
    start = loop.time()
    for i in range(1, 6):
        bc.publish({"k": i, "i": i})
        await asyncio.sleep(0)  # the producer yields between objects, as it does
    items = await reader
    assert [i.obj["i"] for i in items] == [1, 2, 3, 4, 5]
    assert loop.time() - start >= 0.04


async def test_a_terminal_object_wakes_readers_at_once() -> None:
    bc = _bc(linger=5.0)
    reader = asyncio.ensure_future(bc.read(0, 10))
    await asyncio.sleep(0)
    bc.publish({"k": 1})
    bc.publish({"k": 2, "end": True})
    items = await asyncio.wait_for(reader, 1)
    assert [i.terminal for i in items] == [False, True]
    assert bc.closed and bc.drained(items[-1].seq)


async def test_without_linger_each_publish_wakes() -> None:
    bc = _bc()
    reader = asyncio.ensure_future(bc.read(0, 5))
    await asyncio.sleep(0)
    bc.publish({"k": 1})
    bc.publish({"k": 2})
    assert [i.obj["k"] for i in await asyncio.wait_for(reader, 1)] == [1, 2]


async def test_shared_streams_run_one_producer_per_key_and_stop_it_with_the_last_reader(
) -> None:
    streams = SharedStreams(key_of=lambda o: o["k"], is_terminal=lambda o: False,
                            on_crash=lambda e: {"k": "crash"})
    started: list[str] = []
    cancelled = asyncio.Event()

    async def producer(out: Broadcast) -> None:
        started.append("p")
        out.publish({"k": "x"})
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with streams.join("a", producer) as one, streams.join("a", producer) as two:
        assert one is two and len(streams) == 1
        await asyncio.sleep(0.01)
        assert started == ["p"]
    assert cancelled.is_set() and len(streams) == 0


async def test_a_crashing_producer_ends_readers_with_its_crash_object() -> None:
    streams = SharedStreams(key_of=lambda o: o["k"], is_terminal=lambda o: o["k"] == "crash",
                            on_crash=lambda e: {"k": "crash", "why": str(e)})

    async def producer(out: Broadcast) -> None:
        raise RuntimeError("boom")

    got: list[Any] = []
    async with streams.join("b", producer) as bc:
        items = await bc.read(-1, 1)
        got = [i.obj for i in items]
        assert bc.drained(items[-1].seq)
    assert got == [{"k": "crash", "why": "boom"}]
