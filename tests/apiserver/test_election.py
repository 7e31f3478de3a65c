"""Leader election on a coordination.k8s.io/v1 Lease in a fake kube-apiserver: one
leader at a time, expiry judged by when a replica last saw the Lease change, a
higher epoch for every new term, and a released Lease taken over at once."""

from __future__ import annotations

from typing import Any

import pytest

from aggapi.apiserver.election import CERT_SHA256, EPOCH, LeaseElection
from tests.framework.fakekube import FakeKube

LEASES = "apis/coordination.k8s.io/v1"


@pytest.fixture
def kube(lease_kube: FakeKube) -> FakeKube:
    return lease_kube


class Replica:
    def __init__(self, kube: FakeKube, name: str, clock: list[float]) -> None:
        self.changes = 0
        self.election = LeaseElection(
            kube.kube_client(), namespace="aggapi", name="aggapi-collections",
            identity=name, endpoint=f"https://{name}:8443", cert_sha256=lambda: "ab" * 32,
            wall=lambda: 1000.0, monotonic=lambda: clock[0])

        async def changed() -> None:
            self.changes += 1
        self.election.listeners.append(changed)


async def test_one_leader_a_new_epoch_per_term_and_release(kube: FakeKube) -> None:
    clock = [0.0]
    a, b = Replica(kube, "a", clock), Replica(kube, "b", clock)
    try:
        await a.election.tick()
        await b.election.tick()
        assert a.election.is_leader and not b.election.is_leader
        assert b.election.leader is not None and b.election.leader.identity == "a"
        assert b.election.leader.endpoint == "https://a:8443"
        first = a.election.epoch
        assert first == 1000 and b.election.leader.epoch == first
        lease = kube.get(LEASES, "leases", "aggapi", "aggapi-collections")
        assert lease is not None and lease["metadata"]["annotations"][CERT_SHA256] == "ab" * 32
        # a renews every round: b never takes over however long it waits
        for _ in range(10):
            clock[0] += 5
            await a.election.tick()
            await b.election.tick()
        assert a.election.is_leader and not b.election.is_leader
        # a stops renewing (killed): b takes over once the Lease is unchanged 15 s,
        # with an epoch above a's though the wall clock did not move
        clock[0] += 16
        await b.election.tick()
        assert b.election.is_leader and b.election.epoch == first + 1
        await a.election.tick()
        assert not a.election.is_leader and a.election.leader is not None
        assert a.election.leader.identity == "b"
        # b shuts down and releases: a leads at its next round, epoch above again
        await b.election.release()
        await b.election.tick()  # shutting down: it never takes the Lease back
        assert not b.election.is_leader
        await a.election.tick()
        assert a.election.is_leader and a.election.epoch == first + 2
        lease = kube.get(LEASES, "leases", "aggapi", "aggapi-collections")
        assert lease is not None and lease["metadata"]["annotations"][EPOCH] == str(first + 2)
        assert lease["spec"]["leaseTransitions"] == 2
        assert a.changes >= 3 and b.changes >= 2
    finally:
        await a.election.kube.close()
        await b.election.kube.close()


async def test_a_lost_race_follows(kube: FakeKube) -> None:
    """Both see no Lease and create it: the second create is 409, and that replica
    follows the winner."""
    clock = [0.0]
    a, b = Replica(kube, "a", clock), Replica(kube, "b", clock)
    try:
        await a.election._acquire(None)
        await b.election._acquire(None)  # 409 AlreadyExists
        assert a.election.is_leader and not b.election.is_leader
        await b.election.tick()
        assert b.election.leader is not None and b.election.leader.identity == "a"
    finally:
        await a.election.kube.close()
        await b.election.kube.close()


async def test_a_follower_without_a_leader_or_a_forwarded_request_is_503() -> None:
    """Never a loop: a request another replica forwarded, reaching one that does not
    lead (the leader just changed), is 503 with Retry-After, not forwarded again."""
    from aiohttp.test_utils import make_mocked_request

    from aggapi.apiserver.election import Election, Leader
    from aggapi.apiserver.replicas import FORWARDED, LeaderRouted
    from aggapi.status import StatusError

    served: list[str] = []

    async def local(_request: object) -> Any:
        served.append("here")
        return None

    election = Election()
    election.is_leader = False
    routed = LeaderRouted(local, election, None)
    for leader, headers in ((None, {}), (Leader("b", "https://b:1", "00", 2),
                                         {FORWARDED: "a"})):
        election.leader = leader
        with pytest.raises(StatusError) as err:
            await routed(make_mocked_request("GET", "/x", headers=headers))
        assert err.value.code == 503 and err.value.retry_after == 1
    election.is_leader = True
    await routed(make_mocked_request("GET", "/x", headers={FORWARDED: "a"}))
    assert served == ["here"]


async def test_a_new_leader_is_503_until_its_feeds_serve_its_term() -> None:
    """Between winning the Lease and its term's start (up to mirror.SETTLE s waiting
    for the mirror's last changes) a leader answers 503, not from the feeds of no term
    (a build there would hand out versions no term keeps)."""
    from aiohttp.test_utils import make_mocked_request

    from aggapi.apiserver.election import Election
    from aggapi.apiserver.replicas import LeaderRouted
    from aggapi.status import StatusError

    served: list[str] = []

    async def local(_request: object) -> Any:
        served.append("here")
        return None

    election = Election()
    election.epoch = 7
    term: list[int | None] = [None]
    routed = LeaderRouted(local, election, None, lambda: term[0])
    with pytest.raises(StatusError) as err:
        await routed(make_mocked_request("GET", "/x"))
    assert err.value.code == 503 and err.value.retry_after == 1 and served == []
    term[0] = 7
    await routed(make_mocked_request("GET", "/x"))
    assert served == ["here"]
