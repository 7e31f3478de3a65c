"""/readyz of replicas built as main.py builds them (``--leader-elect``, the warm feed):
a follower is ready once its mirror of the leader's podimagepulls has synced (the
aggregator then routes lists to it, and a roll stops an old replica only once the new
one could lead from its mirror); it stays ready after."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from aggapi.apiserver.collections import feeds as feedsmod
from aggapi.apiserver.election import LeaseElection
from aggapi.kube.client import KubeClient
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .collections.fakes import pod
from .conftest import Server

TOKEN = "replica-sa-token"


async def _readyz(srv: Server) -> tuple[int, str]:
    async with srv.session().get("/readyz?verbose") as resp:
        return resp.status, await resp.text()


async def test_a_follower_is_ready_once_its_mirror_synced(
        make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.writable.add("leases")
    kube.sar_policy = lambda _spec: True
    kube.tokens[TOKEN] = {"username": "system:serviceaccount:aggapi:aggapi-apiserver",
                          "groups": ["system:serviceaccounts"]}

    async def token(_self: KubeClient) -> str:
        return TOKEN
    monkeypatch.setattr(KubeClient, "bearer_token", token)
    kube.put("api/v1", "pods", pod("a"))
    # The leader's build is held: neither replica is ready, nor the follower's mirror.
    building = asyncio.Event()
    first_sync = feedsmod.PodFeed._first_sync

    async def held(self: feedsmod.PodFeed) -> None:
        await building.wait()
        await first_sync(self)
    monkeypatch.setattr(feedsmod.PodFeed, "_first_sync", held)

    servers: list[Server] = []
    for i in range(2):
        srv = await make_server(leader_elect=True, pod_namespace="aggapi",
                                pod_name=f"r{i}", advertise_address="127.0.0.1",
                                collection_warm=True)
        election = cast(LeaseElection, srv.parts.election)
        election.retry_period = 0.2
        election.endpoint = srv.url  # the fixture serves on a port of its own choosing
        servers.append(srv)
    elections = [cast(LeaseElection, s.parts.election) for s in servers]
    await until(lambda: sum(e.is_leader for e in elections) == 1 and all(
        e.leader is not None and not e.leader.endpoint.endswith(":0") for e in elections))
    follower = servers[next(i for i, e in enumerate(elections) if not e.is_leader)]
    mirror = follower.parts.mirror
    assert mirror is not None
    for srv in servers:
        status, text = await _readyz(srv)
        assert status == 503 and "[-]collections failed" in text, text
    building.set()
    await until(lambda: mirror.synced)
    status, text = await _readyz(follower)
    assert status == 200 and "[+]collections ok" in text, text
    mirror.follow(None)  # the leader is gone for now: ready still (built once)
    assert (await _readyz(follower))[0] == 200
