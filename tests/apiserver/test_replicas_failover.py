"""Two replicas built as main.py builds them (``--leader-elect``: the Lease election,
the forwarder, the feeds' terms), over a fake kube-apiserver: both answer with the
leader's one history; the leader shuts down, releases the Lease, the other leads a
new term within a retry period, and a version of the old term is 410 there."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.election import LeaseElection
from aggapi.apiserver.parts import Parts
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.routes import Route
from aggapi.kube.client import KubeClient
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .collections.fakes import FakeAgent, pod
from .conftest import GV, Server

TOKEN = "replica-sa-token"
ALICE = {"Authorization": "Bearer alice-token"}
LIST = GV + "/namespaces/ns1/podimagepulls"


async def _get(srv: Server, path: str) -> tuple[int, Any]:
    async with srv.session().get(path, headers=ALICE) as resp:
        return resp.status, json.loads(await resp.text())


async def test_two_replicas_one_history_and_a_failover(
        make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.writable.add("leases")
    kube.sar_policy = lambda _spec: True
    kube.tokens["alice-token"] = {"username": "alice", "groups": ["devs"]}
    kube.tokens[TOKEN] = {"username": "system:serviceaccount:aggapi:aggapi-apiserver",
                          "groups": ["system:serviceaccounts"]}

    async def token(_self: KubeClient) -> str:
        return TOKEN
    monkeypatch.setattr(KubeClient, "bearer_token", token)
    agent = FakeAgent()

    def setup(parts: Parts) -> list[Route]:
        # the scripted agent's feeds, started a term by the election as complete() does
        parts.feeds = Feeds(Sources(parts.kube_api, linger=1.0), cast(AgentClient, agent),
                            linger=1.0, poll_interval=0.05)
        election = cast(LeaseElection, parts.election)
        election.retry_period = 0.2
        feeds = parts.feeds

        async def new_term() -> None:
            await feeds.new_term(election.epoch if election.is_leader else None)
        election.listeners[0] = new_term  # complete()'s, on these feeds instead
        return []

    servers: list[Server] = []
    for i in range(2):
        srv = await make_server(setup=setup, leader_elect=True, pod_namespace="aggapi",
                                pod_name=f"r{i}", advertise_address="127.0.0.1")
        election = cast(LeaseElection, srv.parts.election)
        election.endpoint = srv.url  # the fixture serves on a port of its own choosing
        servers.append(srv)
    kube.put("api/v1", "pods", pod("a"))
    elections = [cast(LeaseElection, s.parts.election) for s in servers]
    await until(lambda: sum(e.is_leader for e in elections) == 1 and all(
        e.leader is not None and e.leader.endpoint.startswith("https://127.0.0.1:")
        and not e.leader.endpoint.endswith(":0") for e in elections))
    first = next(i for i, e in enumerate(elections) if e.is_leader)
    other = servers[1 - first]
    code, listed = await _get(other, LIST)  # forwarded to the leader
    assert code == 200 and [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    code, same = await _get(servers[first], LIST)
    assert same["metadata"]["resourceVersion"] == listed["metadata"]["resourceVersion"]
    # The leader shuts down: it releases the Lease before draining; the other leads.
    await servers[first].runner.cleanup()
    await until(lambda: elections[1 - first].is_leader, within=5)
    assert elections[1 - first].epoch is not None
    code, body = await _get(other, f"{LIST}?watch=true&resourceVersion="
                                   f"{listed['metadata']['resourceVersion']}")
    assert code == 410 and body["reason"] == "Expired"  # the old term's version: relist
    code, relisted = await _get(other, LIST)
    assert code == 200 and [o["metadata"]["name"] for o in relisted["items"]] == ["a"]
    assert int(relisted["metadata"]["resourceVersion"]) > int(
        listed["metadata"]["resourceVersion"])
