"""The hand-over on the Lease (election.py): a leader shutting down asks for a
successor; the first follower able to (its mirror synced) names itself, the others
do not warm; the leader leads on until its successor is warm, then hands it the
Lease, which it takes at once with the next epoch. With no successor warm within the
bound, the Lease is released to whoever takes it first, as before."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from aggapi.apiserver.election import ENDPOINT, LeaseElection
from aggapi.apiserver.handover import HANDOVER, SUCCESSOR, SUCCESSOR_READY, Succession
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

LEASES = "apis/coordination.k8s.io/v1"


@pytest.fixture
def kube(lease_kube: FakeKube) -> FakeKube:
    return lease_kube


class Replica:
    """An election whose succession is scripted: ``able`` says whether its mirror is
    synced; its warm-up ends when the test sets ``warm_done``."""

    def __init__(self, kube: FakeKube, name: str, clock: list[float],
                 log: list[str]) -> None:
        self.name, self.log = name, log
        self.able = True
        self.warm_done = asyncio.Event()
        self.election = LeaseElection(
            kube.kube_client(), namespace="aggapi", name="aggapi-collections",
            identity=name, endpoint=f"https://{name}:8443", cert_sha256=lambda: "ab" * 32,
            wall=lambda: 1000.0, monotonic=lambda: clock[0])

        async def warm() -> None:
            log.append(f"{name} warms")
            await self.warm_done.wait()
            log.append(f"{name} warm")

        async def cool() -> None:
            log.append(f"{name} cools")

        async def changed() -> None:
            e = self.election
            log.append(f"{name} leads {e.epoch}" if e.is_leader else
                       f"{name} follows {e.leader.identity if e.leader else None}")
        self.election.succession = Succession(able=lambda: self.able, warm=warm, cool=cool)
        self.election.listeners.append(changed)


def notes(kube: FakeKube) -> dict[str, str]:
    lease = kube.get(LEASES, "leases", "aggapi", "aggapi-collections")
    assert lease is not None
    return dict(lease["metadata"].get("annotations") or {})


@dataclass
class Scene:
    replicas: list[Replica]
    clock: list[float]  # the elections' monotonic clock, moved by the test
    log: list[str]
    handing: asyncio.Future[None]  # the first replica's hand_over, asked for


@contextlib.asynccontextmanager
async def handing_over(kube: FakeKube, names: str, timeout: float, *, unable: str = "",
                       retry: float | None = None) -> AsyncIterator[Scene]:
    """Replicas ``names`` (those in ``unable`` cannot succeed), each elected once: the
    first leads and has asked for a successor."""
    clock: list[float] = [0.0]
    log: list[str] = []
    rs = [Replica(kube, n, clock, log) for n in names]
    for r in rs:
        r.able = r.name not in unable
    if retry is not None:
        rs[0].election.retry_period = retry
    try:
        for r in rs:
            await r.election.tick()
        handing = asyncio.ensure_future(rs[0].election.hand_over(timeout=timeout))
        await until(lambda: notes(kube).get(HANDOVER) == names[0])
        yield Scene(rs, clock, log, handing)
    finally:
        for r in rs:
            await r.election.kube.close()


def holder(kube: FakeKube) -> str:
    lease = kube.get(LEASES, "leases", "aggapi", "aggapi-collections")
    assert lease is not None
    return str(lease["spec"].get("holderIdentity") or "")


async def test_one_follower_warms_and_the_leader_hands_it_the_lease_when_warm(
        kube: FakeKube) -> None:
    clock: list[float] = [0.0]
    log: list[str] = []
    a, b, c = (Replica(kube, n, clock, log) for n in "abc")
    b.able = False  # its mirror is not synced: it cannot succeed
    try:
        for r in (a, b, c):
            await r.election.tick()
        assert a.election.is_leader and a.election.epoch == 1000
        handing = asyncio.ensure_future(a.election.hand_over(timeout=30))
        await until(lambda: notes(kube).get(HANDOVER) == "a")
        for r in (b, c, b, c):  # b cannot; c names itself; b then sees c named
            await r.election.tick()
        assert notes(kube).get(SUCCESSOR) == "c"
        await until(lambda: "c warms" in log)
        # c warms; a leads on (and renews) however long it takes
        for _ in range(3):
            clock[0] += 5
            for r in (a, b, c):
                await r.election.tick()
        assert a.election.is_leader and not handing.done()
        assert SUCCESSOR_READY not in notes(kube)
        c.warm_done.set()
        await until(lambda: "c warm" in log)
        await c.election.tick()  # says it is warm
        assert notes(kube).get(SUCCESSOR_READY)
        await asyncio.wait_for(handing, 20)
        assert a.election.is_leader  # until it releases: it stamps every change till then
        await a.election.release()
        # handed: c holds it, with no address until it writes its own
        assert holder(kube) == "c" and ENDPOINT not in notes(kube)
        await b.election.tick()  # not b's to take, though no one serves yet
        assert not b.election.is_leader and b.election.leader is None
        await c.election.tick()
        assert c.election.is_leader and c.election.epoch == 1001
        assert not {HANDOVER, SUCCESSOR, SUCCESSOR_READY} & set(notes(kube))
        await b.election.tick()
        assert b.election.leader is not None and b.election.leader.identity == "c"
        # the order that makes the successor's term warm: warm, then a lets go, then c
        assert log.index("c warm") < log.index("a follows None") < log.index("c leads 1001")
        assert "b warms" not in log and "c cools" not in log
    finally:
        for r in (a, b, c):
            await r.election.kube.close()


async def test_a_successor_not_warm_within_the_bound_gets_the_lease_as_it_is(
        kube: FakeKube) -> None:
    """Its informers have listed or are listing, ahead of any other follower's: the
    Lease is handed to it, not left to whichever follower reads it first, and it
    takes it at its next read; its unfinished build is its term's (the property
    test's "warm")."""
    async with handing_over(kube, "abc", 1.0) as scene:
        a, b, c = scene.replicas
        log = scene.log
        handing = scene.handing
        await b.election.tick()  # names itself, never gets warm
        await asyncio.wait_for(handing, 20)
        await a.election.release()
        assert holder(kube) == "b"
        await c.election.tick()  # not c's
        assert not c.election.is_leader
        await b.election.tick()
        assert b.election.is_leader and b.election.epoch == 1001
        assert "b warms" in log and "b warm" not in log


async def test_a_successor_cools_when_another_replica_leads(kube: FakeKube) -> None:
    """The leader dies during the hand-over (no release): the Lease expires; whoever
    takes it, the successor's warm-up ends there and it follows (or leads) as before."""
    async with handing_over(kube, "abc", 30) as scene:
        _, b, c = scene.replicas
        clock = scene.clock
        log = scene.log
        handing = scene.handing
        await b.election.tick()
        await until(lambda: "b warms" in log)
        handing.cancel()  # a is killed
        await c.election.tick()  # the Lease as a left it (expiry counts from here)
        clock[0] += 16
        await c.election.tick()  # expired: c takes it, the hand-over's marks dropped
        assert c.election.is_leader
        await b.election.tick()
        assert b.election.leader is not None and b.election.leader.identity == "c"
        assert "b cools" in log


async def test_with_no_follower_able_the_lease_is_released_without_waiting_the_bound(
        kube: FakeKube) -> None:
    """No follower names itself within a few of its rounds (the only replica, or the
    others' mirrors not synced): the leader lets go then, not at the bound."""
    clock: list[float] = [0.0]
    log: list[str] = []
    a, b = (Replica(kube, n, clock, log) for n in "ab")
    a.election.retry_period = 0.1
    b.able = False
    try:
        await a.election.tick()
        await b.election.tick()
        handing = asyncio.ensure_future(a.election.hand_over(timeout=3600))
        await until(lambda: notes(kube).get(HANDOVER) == "a")
        await b.election.tick()
        await asyncio.wait_for(handing, 20)
        assert SUCCESSOR not in notes(kube) and "b warms" not in log
    finally:
        for r in (a, b):
            await r.election.kube.close()


async def test_a_successor_shutting_down_withdraws_and_another_succeeds(
        kube: FakeKube) -> None:
    """A rolling update may stop the named successor too: it un-names itself, so the
    leader never hands the Lease to a replica that is going; another one claims."""
    async with handing_over(kube, "abc", 30) as scene:
        a, b, c = scene.replicas
        log = scene.log
        handing = scene.handing
        await b.election.tick()
        assert notes(kube).get(SUCCESSOR) == "b"
        await b.election.release()  # b is stopped
        assert SUCCESSOR not in notes(kube) and not b.election.is_leader
        await c.election.tick()
        assert notes(kube).get(SUCCESSOR) == "c"
        c.warm_done.set()
        await until(lambda: "c warm" in log)
        await c.election.tick()
        await asyncio.wait_for(handing, 20)
        await a.election.release()
        await c.election.tick()
        assert c.election.is_leader and holder(kube) == "c"
