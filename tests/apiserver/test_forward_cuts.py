"""A forwarded watch ends between events, never inside one; a forwarded list is not
cut by a leader change (replicas.Forwarder._copy)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.replicas import Forwarder
from tests.framework.until import until

from .collections.fakes import pod
from .conftest import GV
from .replicaharness import ALICE, RUNS, Cluster, replicas

__all__ = ["replicas"]  # the fixture


class Upstream:
    """The leader's response: ``chunks`` as TCP may cut them, then a hold until the
    stop (a watch waiting for the next change)."""

    def __init__(self, chunks: list[bytes], sent: asyncio.Event) -> None:
        self.chunks, self.sent = chunks, sent
        self.content = self

    async def iter_any(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c
            await asyncio.sleep(0)
        self.sent.set()
        await asyncio.Event().wait()


class Client:
    def __init__(self) -> None:
        self.got = bytearray()

    async def write(self, data: bytes) -> None:
        self.got += data


def _cut(data: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, 8))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


async def _forwarded(chunks: list[bytes], *, lines: bool) -> bytes:
    sent, stop = asyncio.Event(), asyncio.Event()
    client = Client()
    copy = asyncio.ensure_future(Forwarder._copy(
        Upstream(chunks, sent), client, (stop,), lines=lines))  # type: ignore[arg-type]
    await sent.wait()
    stop.set()  # the leader changed with a line half sent
    await copy
    return bytes(client.got)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), min_size=1,
                max_size=6), st.binary(min_size=1, max_size=30), st.randoms())
def test_a_watch_cut_at_a_leader_change_ends_after_its_last_whole_event(
        events: list[bytes], half: bytes, rng: random.Random) -> None:
    whole = b"".join(e + b"\n" for e in events)
    stream = whole + half.replace(b"\n", b"x")  # the next event, not yet whole
    got = asyncio.run(_forwarded(_cut(stream, rng), lines=True))
    assert got == whole


async def test_a_forwarded_list_is_not_cut_by_a_leader_change(
        replicas: Callable[[int], Any]) -> None:
    """A list through a follower that the leader answers whole (its term's snapshot,
    valid in the next term's mirror) reaches the client whole even when the leader
    changes while it is sent: cut, it would be JSON that does not parse."""
    cluster: Cluster = await replicas(3)
    await cluster.elect(0)
    ns = f"l-{next(RUNS)}"
    labels = {f"k{i:03}": "v" * 90 for i in range(100)}  # 10 KB a pod
    for i in range(2000):
        cluster.kube.put("api/v1", "pods", pod(f"p{i}", namespace=ns, labels=labels))
    leader = cluster.session(cluster.servers[0])

    async def listed() -> bool:
        async with leader.get(f"{GV}/namespaces/{ns}/podimagepulls", headers=ALICE) as r:
            return r.status == 200 and len((await r.json())["items"]) == 2000
    await until(listed, within=30)
    follower = cluster.session(cluster.servers[1])
    async with follower.get(f"{GV}/namespaces/{ns}/podimagepulls", headers=ALICE) as resp:
        assert resp.status == 200
        head = await resp.content.readexactly(1024)  # the rest waits in the sockets
        await cluster.elect(2)
        body = head + await resp.read()
    assert len(json.loads(body)["items"]) == 2000
