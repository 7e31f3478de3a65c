"""The fake kube-apiserver behaves as kubernetes_asyncio expects (list, get, watch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from tests.framework.fakekube import FakeKube


def _pod(name: str, node: str, ns: str = "ns1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": name[:3]}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]}}


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    fake = FakeKube()
    await fake.start()
    yield fake
    await fake.stop()


async def test_get_list_selectors(kube: FakeKube) -> None:
    kube.put("api/v1", "pods", _pod("web-0", "node-a"))
    kube.put("api/v1", "pods", _pod("db-0", "node-b"))
    kube.put("api/v1", "pods", _pod("web-1", "node-a", ns="ns2"))
    async with kube.client() as api:
        v1 = client.CoreV1Api(api)
        pod = await v1.read_namespaced_pod("web-0", "ns1")
        assert pod.spec.node_name == "node-a"
        with pytest.raises(ApiException) as err:
            await v1.read_namespaced_pod("nope", "ns1")
        assert err.value.status == 404
        on_a = await v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=node-a")
        names = {p.metadata.name for p in on_a.items}
        assert names == {"web-0", "web-1"}
        ns1 = await v1.list_namespaced_pod("ns1", label_selector="app=web")
        assert [p.metadata.name for p in ns1.items] == ["web-0"]


async def test_watch_from_resource_version(kube: FakeKube) -> None:
    kube.put("api/v1", "pods", _pod("web-0", "node-a"))
    async with kube.client() as api:
        v1 = client.CoreV1Api(api)
        listed = await v1.list_namespaced_pod("ns1")
        seen: list[tuple[str, str]] = []

        async def consume() -> None:
            async with watch.Watch().stream(v1.list_namespaced_pod, "ns1",
                                            resource_version=listed.metadata.resource_version,
                                            timeout_seconds=5) as events:
                async for ev in events:
                    seen.append((ev["type"], ev["object"].metadata.name))
                    if len(seen) == 3:
                        return
        task = asyncio.create_task(consume())
        await asyncio.sleep(0.1)
        kube.put("api/v1", "pods", _pod("web-1", "node-a"))
        kube.put("api/v1", "pods", _pod("web-0", "node-c"))
        kube.delete("api/v1", "pods", "ns1", "web-1")
        await asyncio.wait_for(task, 5)
    assert seen == [("ADDED", "web-1"), ("MODIFIED", "web-0"), ("DELETED", "web-1")]


async def test_sar_and_tokenreview_scripting(kube: FakeKube) -> None:
    kube.sar_policy = lambda spec: (spec["user"] == "alice", "scripted")
    kube.tokens["t"] = {"username": "bob"}
    async with kube.client() as api:
        authz = client.AuthorizationV1Api(api)
        spec = client.V1SubjectAccessReviewSpec(
            user="alice", resource_attributes=client.V1ResourceAttributes(verb="get"))
        body = client.V1SubjectAccessReview(spec=spec)
        assert (await authz.create_subject_access_review(body)).status.allowed
        spec.user = "eve"
        res = await authz.create_subject_access_review(body)
        assert not res.status.allowed and res.status.reason == "scripted"
        tr = await client.AuthenticationV1Api(api).create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token="t")))
        assert tr.status.authenticated and tr.status.user.username == "bob"
    assert len(kube.sar_calls) == 2 and kube.token_calls == ["t"]
