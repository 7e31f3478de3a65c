"""One history across replicas (docs/kep-aggapi.md, "Consistency model"): N
in-process apiserver replicas over the same pods and agent, each request routed to a
random replica as the aggregator does, leaders changing and replicas losing their
state at random. A client that lists (in pages, each page on any replica) and then
watches, relisting on 410 as client-go's reflector does, ends with a cache equal to
a fresh list: every final phase seen, no event lost, none repeated, all in order.
When every leader change is graceful and the next leader's mirror has caught up, it
never relists at all (the new term starts from the mirror); a version the mirror
never got is 410.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.election import Election, Leader
from aggapi.apiserver.mirror import Mirror, term_listener
from aggapi.apiserver.parts import Parts
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.replicas import Forwarder, cert_sha256
from aggapi.apiserver.routes import Route
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .collections.fakes import FakeAgent, pod
from .conftest import GV, Pki, Server

REPLICA_TOKEN = "replica-sa-token"
RUNS = itertools.count()
SYNCED: list[int] = []  # each mirror's syncs (main.py: the GC freeze), by replica
ALICE = {"Authorization": "Bearer alice-token"}


class ManualElection(Election):
    """Leadership as the test decides (the Lease itself: tests/apiserver/test_election)."""

    def __init__(self) -> None:
        super().__init__()
        self.is_leader = False

    async def set(self, leading: bool, leader: Leader | None, epoch: int) -> None:
        self.is_leader, self.leader = leading, leader
        self.epoch = epoch if leading else None
        await self._changed()


@dataclass
class Cluster:
    servers: list[Server]
    elections: list[ManualElection]
    mirrors: list[Mirror]
    kube: FakeKube
    certs: Pki
    epochs: list[int]  # the last term's, shared by every example of a test

    def leading(self) -> int:
        return next(i for i, e in enumerate(self.elections) if e.is_leader)

    def caught_up(self, i: int) -> bool:
        """Replica ``i``'s mirror holds the leader's cluster-wide state as it is now."""
        feed = self.servers[self.leading()].parts.feeds.pods.get("")
        m = self.mirrors[i]
        return feed is not None and feed.serving and m.synced \
            and m.collection.rv >= feed.collection.rv

    async def holds(self, i: int, rv: str) -> bool:
        """Whether replica ``i``'s mirror has (or gets within a second) version ``rv``:
        a mirror synced after a client's last event does not, and a rolling update
        would cost that client a relist."""
        with contextlib.suppress(AssertionError):
            await until(lambda: rv and self.mirrors[i].collection.owns(int(rv)), within=1)
            return True
        return False

    async def elect(self, i: int) -> None:
        """Replica ``i`` leads a new term; the others (all three) follow it."""
        self.epochs[0] += 1
        epoch = self.epochs[0]
        leader = Leader(f"r{i}", self.servers[i].url, cert_sha256(self.certs.path("tls.crt")),
                        epoch)
        for j, e in enumerate(self.elections):
            if j != i:
                await e.set(False, leader, epoch)
        await self.elections[i].set(True, leader, epoch)

    async def forget(self, i: int) -> None:
        """Replica ``i`` loses its collections' state, as a restart does; a leader's
        restart is a new term on another replica."""
        if self.elections[i].is_leader:
            await self.elect((i + 1) % len(self.servers))
        else:
            await self.servers[i].parts.feeds.new_term(None)
            await self.mirrors[i].take(settle=0)  # its mirror is gone too
            self.mirrors[i].follow(self.elections[i].leader)

    def session(self, srv: Server) -> aiohttp.ClientSession:
        if not srv.sessions:
            srv.session()
        return srv.sessions[0]

    async def get(self, rng: random.Random, path: str) -> tuple[int, Any]:
        srv = rng.choice(self.servers)
        async with self.session(srv).get(GV + path, headers=ALICE) as resp:
            text = await resp.text()
            return resp.status, json.loads(text) if text.startswith("{") else text


def _name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _view(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (str(obj["metadata"]["labels"].get("step")), str(obj["status"]["phase"]),
            str(obj["metadata"]["resourceVersion"]))


@dataclass
class Reflector:
    """client-go's reflector in short: list (paged), watch from the list's version,
    resume from the last version on a dropped watch, relist on 410."""

    cluster: Cluster
    ns: str
    rng: random.Random
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)
    rv: str = ""
    problems: list[str] = field(default_factory=list)
    lists: int = 0
    gone: int = 0  # 410s

    async def _list(self) -> bool:
        items: list[dict[str, Any]] = []
        token, first_rv = "", ""
        while True:
            q = f"?limit=2&continue={quote(token)}" if token else "?limit=2"
            code, body = await self.cluster.get(self.rng, f"/namespaces/{self.ns}/podimagepulls{q}")
            if code != 200:
                return False  # 410 (a continue of an old term) or 503: list again
            first_rv = first_rv or body["metadata"]["resourceVersion"]
            if body["metadata"]["resourceVersion"] != first_rv:
                self.problems.append("a page at another version")
            items += body["items"]
            token = body["metadata"].get("continue", "")
            if not token:
                break
        self.cache = {_name(o): o for o in items}
        self.rv, self.lists = first_rv, self.lists + 1
        return True

    def _apply(self, ev: dict[str, Any], since: int) -> None:
        obj, typ = ev["object"], ev["type"]
        rv = int(obj["metadata"]["resourceVersion"])
        if rv <= since:
            self.problems.append(f"{typ} {_name(obj)} at {rv}, not after {since}: repeated")
        old = self.cache.get(_name(obj))
        if typ == "ADDED" and old is not None:
            self.problems.append(f"ADDED {_name(obj)} already cached")
        if typ in ("MODIFIED", "DELETED") and old is None:
            self.problems.append(f"{typ} {_name(obj)} never seen: an event was lost")
        if typ == "DELETED":
            self.cache.pop(_name(obj), None)
        else:
            self.cache[_name(obj)] = obj
        self.rv = str(rv)

    async def run(self) -> None:
        while True:
            if not self.rv and not await self._list():
                await asyncio.sleep(0.02)
                continue
            srv = self.rng.choice(self.cluster.servers)
            path = (f"{GV}/namespaces/{self.ns}/podimagepulls?watch=true&timeoutSeconds=2"
                    f"&resourceVersion={self.rv}")
            try:
                async with self.cluster.session(srv).get(path, headers=ALICE) as resp:
                    if resp.status == 410:
                        self.rv, self.gone = "", self.gone + 1
                        continue
                    if resp.status != 200:
                        await asyncio.sleep(0.02)
                        continue
                    async for line in resp.content:
                        if not line.strip():
                            continue
                        ev = json.loads(line)
                        if ev["type"] == "ERROR":
                            if ev["object"].get("code") == 410:
                                self.rv, self.gone = "", self.gone + 1
                            break
                        if ev["type"] != "BOOKMARK":
                            self._apply(ev, int(self.rv))
            except (aiohttp.ClientError, ConnectionError):
                await asyncio.sleep(0.02)


OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "step", "step", "done", "delete",
                                          "elect", "forget"]),
                         st.integers(0, 5)), min_size=12, max_size=30)


def _pod(ns: str, i: int, step: int, done: bool) -> dict[str, Any]:
    obj = pod(f"p{i}", namespace=ns, labels={"step": str(step)})
    if done:
        obj["status"]["containerStatuses"] = [{
            "name": "app", "image": "registry.test/app:1",
            "imageID": "registry.test/app@sha256:a",
            "state": {"running": {"startedAt": "2026-12-23T04:26:41Z"}}}]
    return obj


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 3), ops=OPS, seed=st.integers(0, 2**16))
async def test_a_reflector_through_random_replicas_ends_equal_to_a_fresh_list(
        replicas: Callable[[int], Any], n: int, ops: list[tuple[str, int]],
        seed: int) -> None:
    cluster: Cluster = await replicas(n)
    ns = f"ns-{next(RUNS)}"  # a namespace of its own (hypothesis runs an example again)
    rng = random.Random(seed)
    await cluster.elect(rng.randrange(n))
    client = Reflector(cluster, ns, random.Random(seed + 1))
    task = asyncio.ensure_future(client.run())
    steps: dict[int, int] = {}
    done: set[int] = set()
    try:
        for op, i in ops:
            if op == "add" and i not in steps:
                steps[i] = 0
                cluster.kube.put("api/v1", "pods", _pod(ns, i, 0, False))
            elif op in ("step", "done") and i in steps:
                steps[i] += 1
                done |= {i} if op == "done" else set()
                cluster.kube.put("api/v1", "pods", _pod(ns, i, steps[i], i in done))
            elif op == "delete" and i in steps:
                del steps[i]
                done.discard(i)
                cluster.kube.delete("api/v1", "pods", ns, f"p{i}")
            elif op == "elect":
                await cluster.elect(i % n)
            elif op == "forget":
                await cluster.forget(i % n)
            await asyncio.sleep(rng.choice((0, 0.01, 0.06)))
        want = {f"p{i}": (str(s), "Done" if i in done else "Pending")
                for i, s in steps.items()}

        async def settled() -> bool:
            code, fresh = await cluster.get(rng, f"/namespaces/{ns}/podimagepulls")
            if code != 200:
                return False
            truth = {_name(o): _view(o) for o in fresh["items"]}
            last[:] = [truth, {k: _view(o) for k, o in client.cache.items()}, want]
            return {k: v[:2] for k, v in truth.items()} == want and \
                {k: _view(o) for k, o in client.cache.items()} == truth
        last: list[Any] = []
        try:
            await until(settled, within=15)
        except AssertionError:
            raise AssertionError(f"{last} {client.problems} lists={client.lists} "
                                 f"gone={client.gone}") from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert client.problems == [], client.problems


GRACEFUL = st.lists(st.tuples(st.sampled_from(["add", "add", "step", "step", "done", "delete",
                                               "elect"]),
                              st.integers(0, 5)), min_size=12, max_size=30)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 3), ops=GRACEFUL, seed=st.integers(0, 2**16))
async def test_through_graceful_leader_changes_a_watcher_never_relists(
        replicas: Callable[[int], Any], n: int, ops: list[tuple[str, int]],
        seed: int) -> None:
    """Each leader change as a rolling update makes it (the old leader ends its term
    first; the next one's mirror had caught up): the reflector lists once and watches
    on through every term, nothing lost, nothing repeated, never a 410."""
    cluster: Cluster = await replicas(n)
    ns = f"g-{next(RUNS)}"  # a namespace of its own (hypothesis runs an example again)
    rng = random.Random(seed)
    await cluster.elect(rng.randrange(n))
    # The leader's cluster-wide feed serves every namespace (a namespace's own feed,
    # made while it builds, stamps the same changes with other versions) and each
    # follower mirrors it.
    await until(lambda: all(cluster.caught_up(j) for j in range(n)
                            if j != cluster.leading()))
    client = Reflector(cluster, ns, random.Random(seed + 1))
    task = asyncio.ensure_future(client.run())
    steps: dict[int, int] = {}
    done: set[int] = set()
    elected = 0
    try:
        await until(lambda: client.lists == 1)
        for op, i in ops:
            if op == "add" and i not in steps:
                steps[i] = 0
                cluster.kube.put("api/v1", "pods", _pod(ns, i, 0, False))
            elif op in ("step", "done") and i in steps:
                steps[i] += 1
                done |= {i} if op == "done" else set()
                cluster.kube.put("api/v1", "pods", _pod(ns, i, steps[i], i in done))
            elif op == "delete" and i in steps:
                del steps[i]
                done.discard(i)
                cluster.kube.delete("api/v1", "pods", ns, f"p{i}")
            elif op == "elect" and await cluster.holds(
                    nxt := (cluster.leading() + 1 + i % (n - 1)) % n, client.rv):
                await cluster.elect(nxt)
                elected += 1
            await asyncio.sleep(rng.choice((0, 0.01, 0.06)))
        want = {f"p{i}": (str(s), "Done" if i in done else "Pending")
                for i, s in steps.items()}

        async def settled() -> bool:
            code, fresh = await cluster.get(rng, f"/namespaces/{ns}/podimagepulls")
            if code != 200:
                return False
            truth = {_name(o): _view(o) for o in fresh["items"]}
            last[:] = [truth, {k: _view(o) for k, o in client.cache.items()}, want]
            return {k: v[:2] for k, v in truth.items()} == want and \
                {k: _view(o) for k, o in client.cache.items()} == truth
        last: list[Any] = []
        try:
            await until(settled, within=15)
        except AssertionError:
            raise AssertionError(f"{last} {client.problems} lists={client.lists} "
                                 f"gone={client.gone} elected={elected}") from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (client.problems, client.gone, client.lists) == ([], 0, 1)


async def test_a_version_the_mirror_never_got_is_410(replicas: Callable[[int], Any]) -> None:
    """The old leader stamps changes its follower's mirror never gets (its stream
    stopped): after the change of leader, a watch from such a version is 410, while
    one from the mirror's last version goes on."""
    cluster: Cluster = await replicas(2)
    await cluster.elect(0)
    await until(lambda: cluster.caught_up(1))
    assert 1 in SYNCED  # told once synced (the process freezes what it holds then)
    ns = f"lacks-{next(RUNS)}"
    for i, done in ((0, False), (1, True), (2, False)):
        cluster.kube.put("api/v1", "pods", _pod(ns, i, 0, done))
    await until(lambda: cluster.caught_up(1) and sum(
        o["metadata"]["namespace"] == ns
        for o in cluster.mirrors[1].collection.objects.values()) == 3)
    held = cluster.mirrors[1].collection.rv
    cluster.mirrors[1].follow(None)  # the mirror hears nothing more of r0
    cluster.kube.put("api/v1", "pods", _pod(ns, 0, 1, False))
    old = cluster.servers[0].parts.feeds.pods.get("")
    assert old is not None
    await until(lambda: old.collection.rv > held)
    lacked = old.collection.rv
    await cluster.elect(1)
    new = cluster.servers[1].parts.feeds.pods.get("")
    assert new is not None and new.seeded
    await until(new.synced.is_set)  # its first build, diffed against the mirror
    path = f"{GV}/namespaces/{ns}/podimagepulls?watch=true&timeoutSeconds=1&resourceVersion="
    srv = cluster.session(cluster.servers[1])
    async with srv.get(path + str(lacked), headers=ALICE) as resp:
        assert resp.status == 410, await resp.text()
    async with srv.get(path + str(held), headers=ALICE) as resp:
        assert resp.status == 200
        events = [json.loads(line) for line in (await resp.text()).splitlines() if line]
    # The new term's build finds step 1 (the change the mirror missed), in its epoch,
    # and nothing else: the other pods built again equal their mirrored objects.
    assert [(e["type"], _name(e["object"]), e["object"]["metadata"]["labels"]["step"])
            for e in events] == [("MODIFIED", "p0", "1")]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > lacked


@pytest.fixture
async def replicas(make_server: Any, kube: FakeKube, certs: Pki) -> Any:
    """make(n): n replicas (built once per test, three, over one FakeKube and agent)."""
    kube.sar_policy = lambda _spec: True
    kube.tokens["alice-token"] = {"username": "alice", "groups": ["devs"]}
    kube.tokens[REPLICA_TOKEN] = {"username": "system:serviceaccount:aggapi:aggapi-apiserver",
                                  "groups": ["system:serviceaccounts"]}
    agent = FakeAgent()
    built: list[Cluster] = []
    mirrors: list[Mirror] = []
    epochs = [1000]

    async def make(n: int) -> Cluster:
        if not built:
            servers, elections = [], []
            for i in range(3):
                election = ManualElection()

                def setup(parts: Parts, election: ManualElection = election,
                          i: int = i) -> list[Route]:
                    feeds = parts.feeds = Feeds(Sources(parts.kube_api, linger=1.0),
                                                cast(AgentClient, agent), linger=1.0,
                                                poll_interval=0.05)

                    async def token() -> str:
                        return REPLICA_TOKEN
                    parts.election = election
                    parts.forwarder = Forwarder(election, token, f"r{i}", parts.lifecycle)
                    parts.mirror = Mirror(parts.forwarder, election,
                                          on_synced=functools.partial(SYNCED.append, i))
                    mirrors.append(parts.mirror)
                    # as complete() wires them: the feeds' terms first, from the mirror
                    election.listeners.insert(0, term_listener(election, feeds,
                                                               parts.mirror))
                    return []
                servers.append(await make_server(setup=setup))
                elections.append(election)
            built.append(Cluster(servers, elections, mirrors, kube, certs, epochs))
        c = built[0]
        return Cluster(c.servers[:n], c.elections[:n], c.mirrors[:n], kube, certs, epochs)
    return make
