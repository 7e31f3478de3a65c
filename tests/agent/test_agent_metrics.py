"""The agent's metrics: served on their own HTTPS port behind TokenReview +
SubjectAccessReview (FakeKube answers both), with the names and types the KEP lists,
and copy bytes/durations and poll times that follow what happened."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from aggapi import wire
from aggapi.agent.app import PARTS
from aggapi.agent.metrics import AgentMetrics
from tests.agent.agentserver import Agent, client_ssl, pki, run_agent
from tests.agent.copy.conftest import DirResolver
from tests.agent.fakectd import FakeContainerd
from tests.framework.fakekube import FakeKube

PROMETHEUS = "system:serviceaccount:monitoring:prometheus"

# name -> type, as docs/kep-aggapi.md's metrics table lists them (counters' samples
# carry the _total suffix).
AGENT_FAMILIES = {
    "aggapi_agent_requests": "counter",
    "aggapi_agent_progress_subscribers": "gauge",
    "aggapi_agent_progress_polls": "counter",
    "aggapi_agent_progress_poll_duration_seconds": "histogram",
    "aggapi_agent_containerd_calls": "counter",
    "aggapi_agent_copy_bytes": "counter",
    "aggapi_agent_copy_duration_seconds": "histogram",
    "aggapi_agent_image_pulls_in_flight": "gauge",
    "aggapi_agent_image_pulls_stalled": "gauge",
    "aggapi_agent_image_pull_bytes": "counter",
    "aggapi_agent_image_pull_bytes_per_second": "gauge",
    "aggapi_agent_image_pull_slots": "gauge",
    "aggapi_agent_image_pull_duration_seconds": "histogram",
    "aggapi_agent_image_pull_size_bytes": "histogram",
    "aggapi_agent_tokenreviews": "counter",
    "aggapi_agent_token_cache": "counter",
    "aggapi_agent_subjectaccessreviews": "counter",
    "aggapi_agent_authorization_cache": "counter",
}
RUNTIME_FAMILIES = {
    "process_cpu_seconds": "counter",
    "process_resident_memory_bytes": "gauge",
    "process_open_fds": "gauge",
    "process_start_time_seconds": "gauge",
    "python_info": "gauge",
    "python_gc_collections": "counter",
}


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def assert_families(text: str, want: Mapping[str, str]) -> None:
    got = families(text)
    assert {n: got[n].type for n in want if n in got} == dict(want)
    for name, kind in want.items():
        if kind == "counter":
            assert all(s.name == name + "_total" for s in got[name].samples), name


class NoSandboxes:
    async def list_pod_sandboxes(self, labels: Any = None) -> list[Any]:
        return []


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    k = FakeKube()
    await k.start()
    k.tokens = {"prom-token": {"username": PROMETHEUS, "uid": "u1",
                               "groups": ["system:serviceaccounts"]},
                "other-token": {"username": "mallory", "groups": []}}
    k.sar_policy = lambda spec: (spec["user"] == PROMETHEUS and spec.get(
        "nonResourceAttributes") == {"path": "/metrics", "verb": "get"})
    yield k
    await k.stop()


@pytest.fixture
async def agent(tmp_path: Path, kube: FakeKube) -> AsyncIterator[Agent]:
    data = tmp_path / "root"
    data.mkdir()
    api = kube.kube_client()
    async with run_agent(pki(tmp_path / "pki"), cri=NoSandboxes(), containerd=FakeContainerd(),
                         pod_check=False, kube=api, copy_resolver=DirResolver(data),
                         copy_as_root=True, poll_interval=0.01) as a:
        yield a
    await api.close()


def scraper_ssl(agent: Agent) -> ssl.SSLContext:
    """Prometheus trusts the agent's CA; it has no client certificate of ours."""
    return client_ssl(agent.pki, cert=False)


async def scrape(agent: Agent, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.get(
            agent.metrics_url + "/metrics", headers=headers, ssl=scraper_ssl(agent)) as resp:
        return resp.status, await resp.text()


async def test_scrape_needs_a_reviewed_token_and_get_on_metrics(agent: Agent,
                                                                kube: FakeKube) -> None:
    assert (await scrape(agent, None))[0] == 401
    assert (await scrape(agent, "forged"))[0] == 401  # TokenReview: not authenticated
    status, body = await scrape(agent, "other-token")
    assert status == 403
    assert json.loads(body)["message"] == 'forbidden: User "mallory" cannot get path "/metrics"'
    status, body = await scrape(agent, "prom-token")
    assert status == 200
    assert_families(body, {**AGENT_FAMILIES, **RUNTIME_FAMILIES})
    spec = kube.sar_calls[-1]["spec"]
    assert spec["user"] == PROMETHEUS and spec["uid"] == "u1"
    assert "system:authenticated" in spec["groups"]
    assert spec["nonResourceAttributes"] == {"path": "/metrics", "verb": "get"}
    # Both answers are cached: a second scrape asks nothing.
    reviews, sars = len(kube.token_calls), len(kube.sar_calls)
    assert (await scrape(agent, "prom-token"))[0] == 200
    assert (len(kube.token_calls), len(kube.sar_calls)) == (reviews, sars)
    m = agent.app[PARTS].metrics
    assert m.value("aggapi_agent_token_cache_total", result="hit") == 1
    assert m.value("aggapi_agent_subjectaccessreviews_total", result="denied") == 1


async def test_failed_review_is_not_an_allow(agent: Agent, kube: FakeKube) -> None:
    kube.sar_error = 500
    assert (await scrape(agent, "prom-token"))[0] == 503
    kube.sar_error = None
    kube.tokenreview_error = 500
    assert (await scrape(agent, "prom-token-2"))[0] == 401


async def test_metrics_auth_none_serves_anyone(tmp_path: Path) -> None:
    async with run_agent(pki(tmp_path / "pki"), cri=NoSandboxes(), containerd=FakeContainerd(),
                         pod_check=False, metrics_auth="none") as agent:
        status, body = await scrape(agent, None)
    assert status == 200 and "aggapi_agent_requests" in body


async def test_metrics_port_is_not_the_capability_api(agent: Agent) -> None:
    headers = {"Authorization": "Bearer prom-token"}
    async with aiohttp.ClientSession() as s, s.get(
            agent.metrics_url + "/v1/imagepullprogress", headers=headers,
            ssl=scraper_ssl(agent)) as resp:
        assert resp.status in (403, 404)


async def test_the_mtls_port_serves_no_metrics(agent: Agent) -> None:
    """Not even to the apiserver's client certificate: /metrics is on the metrics port
    only (the route is gone, not just guarded)."""
    async with agent.get("/metrics", None) as resp:
        assert resp.status == 404, await resp.text()
        assert "no such agent endpoint" in (await resp.json())["message"]
    m = agent.app[PARTS].metrics
    assert m.value("aggapi_agent_requests_total", route="unmatched", code="404") == 1


async def test_copy_bytes_and_durations_by_direction_and_result(agent: Agent) -> None:
    m = agent.app[PARTS].metrics
    data = os.urandom(100_000)
    digest = hashlib.sha256(data).hexdigest()
    async with agent.copy("POST", "/f.bin", uid="uid-1", images=["img"], data=data,
                          params={"sha256": digest}) as r:
        assert r.status == 200, await r.text()
    async with agent.copy("GET", "/f.bin", uid="uid-1", images=["img"]) as r:
        assert await r.read() == data
    async with agent.copy("GET", "/missing", uid="uid-1", images=["img"]) as r:
        assert r.status == 404
    async with agent.copy("HEAD", "/f.bin", uid="uid-1", images=["img"]) as r:
        assert r.status == 200
    # A download's handler ends (and is measured) just after its last byte reached the
    # client: wait for the three copies' handlers to have ended.
    for _ in range(500):
        if sum(m.value("aggapi_agent_copy_duration_seconds_count", direction=d, result=r)
               for d in ("upload", "download") for r in ("success", "error")) == 3:
            break
        await asyncio.sleep(0.01)
    assert m.value("aggapi_agent_copy_bytes_total", direction="upload",
                   result="success") == len(data)
    assert m.value("aggapi_agent_copy_bytes_total", direction="download",
                   result="success") == len(data)
    assert m.value("aggapi_agent_copy_bytes_total", direction="download",
                   result="error") == 0
    for direction, result in (("upload", "success"), ("download", "success"),
                              ("download", "error")):
        assert m.value("aggapi_agent_copy_duration_seconds_count", direction=direction,
                       result=result) == 1
    # A stat moves no bytes and is no copy.
    assert m.value("aggapi_agent_copy_duration_seconds_count", direction="upload",
                   result="error") == 0
    assert m.value("aggapi_agent_requests_total", route="/v1/copy", code="404") == 1


async def test_polls_count_and_time_every_poll(agent: Agent) -> None:
    m = agent.app[PARTS].metrics
    poller = agent.app[PARTS].poller
    async for _event in agent.stream(agent.token(images=["127.0.0.1:5000/x:1"])):
        break
    assert poller.polls >= 1
    polls = m.value("aggapi_agent_progress_polls_total")
    assert polls >= 1
    assert m.value("aggapi_agent_progress_poll_duration_seconds_count") == polls


def test_fresh_registry_has_every_family() -> None:
    m = AgentMetrics()
    m.bind(subscribers=lambda: 2, runtime_calls=lambda: 7, sent=lambda _r: (0, False))
    text = generate_latest(m.registry).decode()
    assert_families(text, {**AGENT_FAMILIES, **RUNTIME_FAMILIES})
    got = families(text)
    assert got["aggapi_agent_containerd_calls"].samples[0].value == 7
    assert got["aggapi_agent_progress_subscribers"].samples[0].value == 2


async def test_download_whose_client_hangs_up_after_the_last_byte_is_a_success(
        agent: Agent) -> None:
    """A client may close the connection the moment its Content-Length is in, before the
    handler has returned: that download delivered everything and counts as a success."""
    m = agent.app[PARTS].metrics
    data = os.urandom(300_000)
    async with agent.copy("POST", "/g.bin", uid="uid-1", images=["img"], data=data,
                          params={"sha256": hashlib.sha256(data).hexdigest()}) as r:
        assert r.status == 200, await r.text()
    rounds = 30
    host, port = agent.url.removeprefix("https://").split(":")
    for _ in range(rounds):
        token = agent.token(wire.copy_operation("GET"), images=["img"], uid="uid-1",
                            path="/g.bin", params={})
        reader, writer = await asyncio.open_connection(host, int(port),
                                                       ssl=client_ssl(agent.pki))
        writer.write(f"GET /v1/copy?container=c0&path=/g.bin HTTP/1.1\r\nHost: {host}\r\n"
                     f"Authorization: Bearer {token}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert await reader.readexactly(len(data)) == data
        writer.transport.abort()  # hang up the moment the body is in
    for _ in range(1000):
        done = sum(m.value("aggapi_agent_copy_duration_seconds_count", direction="download",
                           result=res) for res in ("success", "error", "aborted"))
        if done == rounds:
            break
        await asyncio.sleep(0.01)
    assert m.value("aggapi_agent_copy_duration_seconds_count", direction="download",
                   result="success") == rounds, {
        res: m.value("aggapi_agent_copy_duration_seconds_count", direction="download",
                     result=res) for res in ("error", "aborted")}
    assert m.value("aggapi_agent_copy_bytes_total", direction="download",
                   result="success") == rounds * len(data)
