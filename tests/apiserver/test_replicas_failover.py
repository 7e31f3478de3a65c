"""Two replicas built as main.py builds them (``--leader-elect``: the Lease election,
the forwarder, the feeds' terms, the follower's mirror), over a fake kube-apiserver:
both answer with the leader's one history; the leader shuts down, releases the Lease,
the other leads a new term within a retry period from its mirror of the old one: a
watch from the old term's version goes on there, nothing lost, nothing repeated, and
a version the old term never handed out is 410. Shut down as main.py does at SIGTERM,
the leader hands over: it stamps and serves every change while the other warms its
term, whose informers list before it starts and never after."""

from __future__ import annotations

import asyncio
import json
from typing import Any, cast

import aiohttp
import pytest

from aggapi.apiserver import main
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.election import LeaseElection
from aggapi.apiserver.mirror import succession, term_listener
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


async def _replicas(make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch,
                    gate: asyncio.Event | None = None) -> list[Server]:
    """Two replicas whose election has settled on a leader. ``gate``: a successor's
    warm-up, once its informers listed and it built, waits for it."""
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
        assert parts.mirror is not None
        election.listeners[0] = term_listener(election, parts.feeds, parts.mirror)
        election.succession = warm = succession(parts.feeds, parts.mirror)
        if gate is not None:
            async def gated() -> None:
                await warm.warm()
                await gate.wait()
            election.succession = type(warm)(able=warm.able, warm=gated, cool=warm.cool)
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
    return servers


async def test_two_replicas_one_history_and_a_failover(
        make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    servers = await _replicas(make_server, kube, monkeypatch)
    elections = [cast(LeaseElection, s.parts.election) for s in servers]
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


def _pod_lists(kube: FakeKube) -> int:
    """Cluster-wide pod lists kube-apiserver served (an informer's start)."""
    return sum(1 for method, path in kube.requests if method == "GET"
               and path.startswith("/api/v1/pods") and "watch=" not in path
               and "continue=" not in path)


async def test_a_leader_shutting_down_hands_over_to_a_warm_successor(
        make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shut down as main.py does at SIGTERM: the follower warms (its informers list,
    it builds) while the leader leads on; a change made meanwhile is stamped by the
    leader and reaches a watcher before the Lease changes hands. The successor's term
    then starts from that warm feed (no list after it starts) and its mirror: the
    watcher goes on with no 410, each change once, the old term's then the new's."""
    gate = asyncio.Event()
    servers = await _replicas(make_server, kube, monkeypatch, gate)
    elections = [cast(LeaseElection, s.parts.election) for s in servers]
    first = next(i for i, e in enumerate(elections) if e.is_leader)
    old, new = servers[first], servers[1 - first]
    mirror = new.parts.mirror
    assert mirror is not None
    await until(lambda: mirror.synced)
    code, listed = await _get(new, LIST)  # forwarded to the leader
    assert code == 200
    events: list[dict[str, Any]] = []
    gone: list[int] = []
    watching = asyncio.ensure_future(_follow(new, listed["metadata"]["resourceVersion"],
                                             events, gone))
    started: list[tuple[bool, int]] = []  # at the successor's term's start

    async def term_starts() -> None:
        if elections[1 - first].is_leader:
            started.append((True, _pod_lists(kube)))
    elections[1 - first].listeners.insert(0, term_starts)
    try:
        handing = asyncio.ensure_future(main.hand_over(old.app, old.parts.config))
        await until(lambda: (w := new.parts.feeds.warming) is not None
                    and w.synced.is_set(), within=30)
        warm = new.parts.feeds.warming
        warm_lists = _pod_lists(kube)
        kube.put("api/v1", "pods", pod("b"))  # while the successor is warm, not ready
        await until(lambda: [e["object"]["metadata"]["name"] for e in events] == ["b"])
        assert elections[first].is_leader and not elections[1 - first].is_leader
        old_epoch = elections[first].epoch
        assert old_epoch is not None
        gate.set()
        await asyncio.wait_for(handing, 30)
        await until(lambda: elections[1 - first].is_leader
                    and new.parts.feeds.term == elections[1 - first].epoch, within=5)
        kube.put("api/v1", "pods", pod("c"))  # the new term's
        await until(lambda: len(events) == 2)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"), ("ADDED", "c")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    new_epoch = elections[1 - first].epoch
    assert new_epoch is not None and new_epoch > old_epoch
    assert [rv >> 32 for rv in rvs] == [old_epoch, new_epoch]
    assert gone == []
    # Its informers listed while it warmed, before its term, and not since: the term's
    # cluster-wide feed is the warm one.
    assert started == [(True, warm_lists)] and _pod_lists(kube) == warm_lists
    assert new.parts.feeds.pods.get("") is warm


async def _follow(srv: Server, rv: str, events: list[dict[str, Any]],
                  gone: list[int]) -> None:
    """A watcher of ns1 through ``srv``, resuming from its last version."""
    while True:
        path = f"{LIST}?watch=true&timeoutSeconds=5&resourceVersion={rv}"
        try:
            async with srv.session().get(path, headers=ALICE) as resp:
                if resp.status == 410:
                    gone.append(410)
                    return
                if resp.status != 200:
                    await asyncio.sleep(0.05)
                    continue
                async for line in resp.content:
                    if line.strip():
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            gone.append(ev["object"].get("code"))
                            return
                        if ev["type"] != "BOOKMARK":
                            events.append(ev)
                        rv = ev["object"]["metadata"]["resourceVersion"]
        except (TimeoutError, OSError, aiohttp.ClientError):
            await asyncio.sleep(0.05)
