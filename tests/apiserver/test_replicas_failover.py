"""Two replicas built as main.py builds them (``--leader-elect``: the Lease election,
the forwarder, the feeds' terms, the follower's mirror), over a fake kube-apiserver:
both answer with the leader's one history; the leader shuts down, releases the Lease,
the other leads a new term within a retry period from its mirror of the old one: a
watch from the old term's version goes on there, nothing lost, nothing repeated, and
a version the old term never handed out is 410."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.election import LeaseElection
from aggapi.apiserver.mirror import term_listener
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
        # complete()'s, on these feeds instead
        election.listeners[0] = term_listener(election, parts.feeds, parts.mirror)
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
    mirror = other.parts.mirror
    assert mirror is not None
    # Synced: the leader's cluster-wide feed runs (the mirror watches it) and serves
    # every namespace, so the list's version is one the mirror holds.
    await until(lambda: mirror.synced)
    code, listed = await _get(other, LIST)  # forwarded to the leader
    assert code == 200 and [o["metadata"]["name"] for o in listed["items"]] == ["a"]
    code, same = await _get(servers[first], LIST)
    assert same["metadata"]["resourceVersion"] == listed["metadata"]["resourceVersion"]
    kube.put("api/v1", "pods", pod("b"))  # after the list: a change the watch must bring
    leader_pods = servers[first].parts.feeds.pods.get("")
    assert leader_pods is not None
    await until(lambda: len(leader_pods.collection.objects) == 2)
    last_old = leader_pods.collection.rv
    # The leader shuts down: it releases the Lease before draining; the other leads,
    # from its mirror of the old term.
    await servers[first].runner.cleanup()
    await until(lambda: elections[1 - first].is_leader, within=5)
    assert elections[1 - first].epoch is not None
    kube.put("api/v1", "pods", pod("c"))  # the new term's
    since = listed["metadata"]["resourceVersion"]
    events = await _watch(other, f"{LIST}?watch=true&timeoutSeconds=1&resourceVersion={since}")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"), ("ADDED", "c")]  # the old term's last change, then the new's
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs[0] == last_old and rvs[1] > last_old
    code, relisted = await _get(other, LIST)
    assert code == 200 and [o["metadata"]["name"] for o in relisted["items"]] == ["a", "b", "c"]
    # A version the old term never handed out (one past its last): 410 Expired.
    code, body = await _get(other, f"{LIST}?watch=true&resourceVersion={last_old + 1}")
    assert code == 410 and body["reason"] == "Expired"


async def _watch(srv: Server, path: str) -> list[dict[str, Any]]:
    async with srv.session().get(path, headers=ALICE) as resp:
        assert resp.status == 200, await resp.text()
        return [json.loads(line) for line in (await resp.text()).splitlines() if line]
