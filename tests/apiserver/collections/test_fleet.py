"""The fleet's pulls per registry host on the leader's /metrics (collections.fleet):
computed from the NodeImagePull and PodImagePull objects, scraped through the real
app with a FakeKube and a scripted agent; only with --fleet-metrics, only while this
replica leads."""

from __future__ import annotations

from typing import Any, cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.collections.fleet import FleetMetrics, fleet_view
from aggapi.apiserver.parts import Parts
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.routes import Route
from aggapi.registrylabels import MAX_REGISTRIES, OTHER, RegistryLabels
from tests.framework.fakekube import FakeKube

from ..conftest import Server
from .fakes import FakeAgent, event, node_view, pod, pull

FAMILIES = ("aggapi_apiserver_fleet_image_pulls_in_flight",
            "aggapi_apiserver_fleet_image_pull_bytes_per_second",
            "aggapi_apiserver_fleet_nodes_pulling",
            "aggapi_apiserver_fleet_image_pulls_waiting")


def node_obj(name: str, *pulls: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"pulls": list(pulls)}}


def pod_obj(*images: tuple[str, bool]) -> dict[str, Any]:
    return {"status": {"images": [{"image": i, "waitingForSlot": w} for i, w in images]}}


def test_figures_per_registry_host() -> None:
    nodes = [node_obj("a", pull("r1.example/app", progress=1, total=9, rate=100.0),
                      pull("r2.example:5000/db", progress=1, total=9, rate=None)),
             node_obj("b", pull("r1.example/web", progress=1, total=9, rate=50.5)),
             node_obj("c")]
    pods = [pod_obj(("r1.example/app:2", True), ("r1.example/app:2", True)),  # one pull
            pod_obj(("r2.example:5000/db:1", True), ("busybox", False)),
            pod_obj(("nginx", True))]
    view = fleet_view(nodes, pods, RegistryLabels())
    got = {r: (f.in_flight, f.bytes_per_second, sorted(f.nodes), f.waiting)
           for r, f in view.items()}
    assert got == {"r1.example": (2, 150.5, ["a", "b"], 1),
                   "r2.example": (1, 0.0, ["a"], 1),  # the agents' host: no port
                   "docker.io": (0, 0.0, [], 1)}


def test_registry_hosts_are_capped_as_the_agents_cap_them() -> None:
    nodes = [node_obj("a", *(pull(f"r{i}.example/x", progress=0, total=1)
                             for i in range(MAX_REGISTRIES + 3)))]
    view = fleet_view(nodes, [], RegistryLabels())
    assert len(view) == MAX_REGISTRIES + 1 and view[OTHER].in_flight == 3


def scraped(text: str) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels["registry"]): s.value
            for fam in text_string_to_metric_families(text) if fam.name in FAMILIES
            for s in fam.samples}


async def scrape(srv: Server) -> dict[tuple[str, str], float]:
    async with srv.session().get("/metrics") as resp:
        assert resp.status == 200
        return scraped(await resp.text())


@pytest.fixture
def make_fleet_server(make_server: Any, kube: FakeKube) -> Any:
    async def make(enabled: bool) -> tuple[Server, FakeAgent]:
        agent = FakeAgent()

        def setup(parts: Parts) -> list[Route]:
            parts.feeds = Feeds(Sources(parts.kube_api, linger=1.0),
                                cast(AgentClient, agent), linger=1.0, poll_interval=0.05)
            parts.fleet = FleetMetrics(parts.metrics, parts.feeds, parts.election,
                                       enabled=enabled)
            return []

        srv: Server = await make_server(setup=setup, always_allow_metrics=True)
        return srv, agent
    return make


async def test_a_scrape_shows_the_fleet_then_zero_once_it_is_idle(
        make_fleet_server: Any, kube: FakeKube) -> None:
    srv, agent = await make_fleet_server(True)
    queued = kube.put("api/v1", "pods", pod("queued", "registry.test/q:1", node="node-b"))
    kube.put("api/v1", "events", event(queued, "Pulling", 'Pulling image "registry.test/q:1"'))
    agent.views["node-a"] = node_view(pull("registry.test/app", progress=1, total=9,
                                           rate=1000.0))
    agent.views["node-b"] = node_view(pull("registry.test/other", progress=1, total=9,
                                           rate=24.0), limit=1)
    got = await scrape(srv)  # the first scrape starts the feeds and waits for them
    assert got == {
        ("aggapi_apiserver_fleet_image_pulls_in_flight", "registry.test"): 2,
        ("aggapi_apiserver_fleet_image_pull_bytes_per_second", "registry.test"): 1024.0,
        ("aggapi_apiserver_fleet_nodes_pulling", "registry.test"): 2,
        ("aggapi_apiserver_fleet_image_pulls_waiting", "registry.test"): 1}
    agent.views["node-a"] = node_view()
    agent.views["node-b"] = node_view(limit=1)
    kube.delete("api/v1", "pods", "ns1", "queued")
    for _ in range(100):
        got = await scrape(srv)
        if not any(got.values()):
            break
    assert set(got) == {(f, "registry.test") for f in FAMILIES}
    assert not any(got.values())


async def test_no_fleet_series_without_the_flag_or_the_lead(make_fleet_server: Any) -> None:
    srv, agent = await make_fleet_server(False)
    agent.views["node-a"] = node_view(pull("registry.test/app", progress=1, total=9))
    assert await scrape(srv) == {}
    assert srv.parts.feeds.agent_polls() == 0  # a scrape started no feed
    srv, agent = await make_fleet_server(True)
    agent.views["node-a"] = node_view(pull("registry.test/app", progress=1, total=9))
    assert (await scrape(srv))[("aggapi_apiserver_fleet_nodes_pulling", "registry.test")] == 1
    srv.parts.election.is_leader = False  # another replica leads now
    assert await scrape(srv) == {}
