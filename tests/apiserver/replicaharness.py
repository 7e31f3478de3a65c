"""N in-process apiserver replicas over the same pods and agent, as the replica
property tests drive them (test_replicas_history.py, test_replicas_mirror.py): a manual
election, each replica's forwarder and mirror wired as complete() wires them, requests
routed to a random replica as the aggregator does, and client-go's reflector in short.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote

import aiohttp
import pytest
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
    warming: list[asyncio.Task[None]] = field(default_factory=list)

    def leading(self) -> int:
        return next(i for i, e in enumerate(self.elections) if e.is_leader)

    def caught_up(self, i: int) -> bool:
        """Replica ``i``'s mirror holds the leader's cluster-wide state as it is now."""
        feed = self.servers[self.leading()].parts.feeds.pods.get("")
        m = self.mirrors[i]
        return feed is not None and feed.serving and m.synced \
            and m.collection.rv >= feed.collection.rv

    async def holds(self, i: int, rv: str) -> bool:
        """Whether replica ``i``'s mirror streams from the leader and has (or gets within
        2 s) version ``rv``:
        a mirror synced after a client's last event does not, and a rolling update
        would cost that client a relist."""
        with contextlib.suppress(AssertionError):
            # streaming from the leader now (after a change it reconnects) and holding rv
            await until(lambda: rv and self.caught_up(i)
                        and self.mirrors[i].collection.owns(int(rv)), within=2)
            return True
        return False

    def warm(self, i: int) -> None:
        """Replica ``i`` warms its next term as a successor does while the leader hands
        over (election.py): its informers list and it builds, from now on, beside its
        mirror; its term (``elect``) starts from it, built or not. Electing another
        replica drops it (that one's new_term(None))."""
        feeds, mirror = self.servers[i].parts.feeds, self.mirrors[i]
        self.warming.append(asyncio.ensure_future(
            feeds.prepare(lambda: mirror.collection.objects)))

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
        for task in self.warming:  # (as the election's, at its term's start)
            task.cancel()
        await asyncio.gather(*self.warming, return_exceptions=True)
        self.warming.clear()

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


def name_of(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def view_of(obj: dict[str, Any]) -> tuple[str, str, str]:
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
        self.cache = {name_of(o): o for o in items}
        self.rv, self.lists = first_rv, self.lists + 1
        return True

    def _apply(self, ev: dict[str, Any], since: int) -> None:
        obj, typ = ev["object"], ev["type"]
        rv = int(obj["metadata"]["resourceVersion"])
        if rv <= since:
            self.problems.append(f"{typ} {name_of(obj)} at {rv}, not after {since}: repeated")
        old = self.cache.get(name_of(obj))
        if typ == "ADDED" and old is not None:
            self.problems.append(f"ADDED {name_of(obj)} already cached")
        if typ in ("MODIFIED", "DELETED") and old is None:
            self.problems.append(f"{typ} {name_of(obj)} never seen: an event was lost")
        if typ == "DELETED":
            self.cache.pop(name_of(obj), None)
        else:
            self.cache[name_of(obj)] = obj
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


def pod_at(ns: str, i: int, step: int, done: bool) -> dict[str, Any]:
    obj = pod(f"p{i}", namespace=ns, labels={"step": str(step)})
    if done:
        obj["status"]["containerStatuses"] = [{
            "name": "app", "image": "registry.test/app:1",
            "imageID": "registry.test/app@sha256:a",
            "state": {"running": {"startedAt": "2026-12-23T04:26:41Z"}}}]
    return obj


def script_ops(*others: str) -> st.SearchStrategy[list[tuple[str, int]]]:
    """A property test's script: PodScript's ops (add and step weighed twice) and the
    test's ``others`` (elections, restarts...), each on one of six pods."""
    return st.lists(st.tuples(st.sampled_from(["add", "add", "step", "step", "done",
                                               "delete", *others]),
                              st.integers(0, 5)), min_size=12, max_size=30)


@dataclass
class PodScript:
    """The pods of ``ns`` the property tests drive through kube: each op of add, step,
    done and delete applied where it can be (others do nothing), and the state a list
    must end at."""

    kube: FakeKube
    ns: str
    steps: dict[int, int] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def apply(self, op: str, i: int) -> None:
        if op == "add" and i not in self.steps:
            self.steps[i] = 0
            self.kube.put("api/v1", "pods", pod_at(self.ns, i, 0, False))
        elif op in ("step", "done") and i in self.steps:
            self.steps[i] += 1
            self.done |= {i} if op == "done" else set()
            self.kube.put("api/v1", "pods", pod_at(self.ns, i, self.steps[i], i in self.done))
        elif op == "delete" and i in self.steps:
            del self.steps[i]
            self.done.discard(i)
            self.kube.delete("api/v1", "pods", self.ns, f"p{i}")

    def want(self) -> dict[str, tuple[str, str]]:
        return {f"p{i}": (str(s), "Done" if i in self.done else "Pending")
                for i, s in self.steps.items()}


async def until_settled(cluster: Cluster, rng: random.Random, client: Reflector, ns: str,
                        want: dict[str, tuple[str, str]], note: str = "") -> None:
    """Until a fresh list of ``ns`` has the steps and phases ``want`` and ``client``'s
    cache equals it; the last of both in the failure."""
    last: list[Any] = []

    async def settled() -> bool:
        # From the client's own history (a namespace's feed, made while the
        # cluster-wide one built, stamps the same changes with other versions).
        since = f"?resourceVersion={client.rv}" if client.rv else ""
        code, fresh = await cluster.get(rng, f"/namespaces/{ns}/podimagepulls{since}")
        if code != 200:
            return False
        truth = {name_of(o): view_of(o) for o in fresh["items"]}
        last[:] = [truth, {k: view_of(o) for k, o in client.cache.items()}, want]
        return {k: v[:2] for k, v in truth.items()} == want and \
            {k: view_of(o) for k, o in client.cache.items()} == truth
    try:
        await until(settled, within=15)
    except AssertionError:
        raise AssertionError(f"{last} {client.problems} lists={client.lists} "
                             f"gone={client.gone}{note}") from None


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
