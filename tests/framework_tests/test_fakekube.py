"""The fake kube-apiserver answers as aggapi.kube.client (the product's client) expects: get,
list with selectors, watch from a resourceVersion, errors as Status, SAR, TokenReview."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from aggapi.kube.client import KubeClient, KubeError
from tests.framework.fakekube import SAR_PATH, TOKENREVIEW_PATH, FakeKube


def _pod(name: str, node: str, ns: str = "ns1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name[:3]}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


def _names(listed: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listed["items"]]


@pytest.fixture
async def fake() -> AsyncIterator[FakeKube]:
    fake = FakeKube()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def api(fake: FakeKube) -> AsyncIterator[KubeClient]:
    async with fake.kube_client() as api:
        yield api


async def test_get_list_selectors(fake: FakeKube, api: KubeClient) -> None:
    fake.put("api/v1", "pods", _pod("web-0", "node-a"))
    fake.put("api/v1", "pods", _pod("db-0", "node-b"))
    fake.put("api/v1", "pods", _pod("web-1", "node-a", ns="ns2"))
    pod = await api.get("/api/v1/namespaces/ns1/pods/web-0")
    assert pod["spec"]["nodeName"] == "node-a"
    assert pod["metadata"]["uid"] and pod["metadata"]["resourceVersion"]
    with pytest.raises(KubeError) as err:
        await api.get("/api/v1/namespaces/ns1/pods/nope")
    assert (err.value.status, err.value.reason) == (404, "NotFound")
    on_a = await api.get("/api/v1/pods", {"fieldSelector": "spec.nodeName=node-a"})
    assert sorted(_names(on_a)) == ["web-0", "web-1"]
    ns1 = await api.get("/api/v1/namespaces/ns1/pods", {"labelSelector": "app=web"})
    assert _names(ns1) == ["web-0"]
    not_web = await api.get("/api/v1/pods", {"labelSelector": "app!=web"})
    assert _names(not_web) == ["db-0"]


async def test_writes_are_refused_as_status(api: KubeClient) -> None:
    with pytest.raises(KubeError) as err:
        await api.post("/api/v1/namespaces/ns1/pods", _pod("web-0", "node-a"))
    assert (err.value.status, err.value.reason) == (405, "MethodNotAllowed")


async def test_watch_from_resource_version(fake: FakeKube, api: KubeClient) -> None:
    fake.put("api/v1", "pods", _pod("web-0", "node-a"))
    listed = await api.get("/api/v1/namespaces/ns1/pods")
    seen: list[tuple[str, str]] = []

    async def consume() -> None:
        events = api.watch("/api/v1/namespaces/ns1/pods",
                           resource_version=listed["metadata"]["resourceVersion"],
                           timeout_seconds=5)
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                seen.append((kind, obj["metadata"]["name"]))
                if len(seen) == 3:
                    return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    fake.put("api/v1", "pods", _pod("web-1", "node-a"))
    fake.put("api/v1", "pods", _pod("web-0", "node-c"))
    fake.delete("api/v1", "pods", "ns1", "web-1")
    await asyncio.wait_for(task, 5)
    assert seen == [("ADDED", "web-1"), ("MODIFIED", "web-0"), ("DELETED", "web-1")]


async def test_watch_from_a_compacted_version_is_an_expired_error() -> None:
    fake = FakeKube(history=2)
    await fake.start()
    try:
        for i in range(5):
            fake.put("api/v1", "pods", _pod(f"web-{i}", "node-a"))
        async with fake.kube_client() as client:
            events = [ev async for ev in client.watch("/api/v1/namespaces/ns1/pods",
                                                      resource_version="1", timeout_seconds=5)]
    finally:
        await fake.stop()
    assert [(kind, obj.get("reason"), obj.get("code")) for kind, obj in events] == [
        ("ERROR", "Expired", 410)]


async def test_sar_and_tokenreview_scripting(fake: FakeKube, api: KubeClient) -> None:
    fake.sar_policy = lambda spec: (spec["user"] == "alice", "scripted")
    fake.tokens["t"] = {"username": "bob"}

    def sar(user: str) -> dict[str, Any]:
        return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                "spec": {"user": user, "resourceAttributes": {"verb": "get"}}}

    assert (await api.post(SAR_PATH, sar("alice")))["status"]["allowed"] is True
    denied = (await api.post(SAR_PATH, sar("eve")))["status"]
    assert denied["allowed"] is False and denied["reason"] == "scripted"
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
              "spec": {"token": "t"}}
    status = (await api.post(TOKENREVIEW_PATH, review))["status"]
    assert status["authenticated"] is True and status["user"]["username"] == "bob"
    bad = (await api.post(TOKENREVIEW_PATH, {**review, "spec": {"token": "x"}}))["status"]
    assert bad["authenticated"] is False
    assert len(fake.sar_calls) == 2 and fake.token_calls == ["t", "x"]


async def test_scripted_outages_reach_the_client_as_errors(fake: FakeKube,
                                                           api: KubeClient) -> None:
    fake.sar_error = 503
    with pytest.raises(KubeError) as err:
        await api.post(SAR_PATH, {"spec": {"user": "alice"}})
    assert (err.value.status, err.value.reason) == (503, "ServiceUnavailable")
