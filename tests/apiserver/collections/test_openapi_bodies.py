"""What the server sends matches the OpenAPI it serves, key for key (the strict
check of tests/apiserver/openapicheck.py): the collections' objects and lists, and
nodes/imagepulls, whose body at 95095d5 was the agent's view with no apiVersion or
metadata and whose schema described an ``items`` array that was never sent."""

from __future__ import annotations

import time
from typing import Any

import pytest

from aggapi.apiserver.imagepullprogress.nodeview import node_pulls_object, require_node
from aggapi.apiserver.openapi import v2_document, v3_document
from aggapi.status import StatusError
from tests.framework.openapicheck import check

from .conftest import Env
from .fakes import event, node_view, pod, pull

D = "io.aggapi.subresources.v1alpha1."


def _docs() -> list[dict[str, Any]]:
    return [v2_document()["definitions"], v3_document()["components"]["schemas"]]


async def test_collection_bodies_match_the_served_schema(env: Env) -> None:
    web = pod("web-0", labels={"app": "web"})
    web["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    env.kube.put("api/v1", "pods", web)
    env.kube.put("api/v1", "events", event(web, "Pulling", 'Pulling image "x"'))
    bad = env.kube.put("api/v1", "pods", pod("bad", "registry.test/nope:1", node="node-b"))
    env.kube.put("api/v1", "events", event(bad, "Failed", 'Failed to pull image "x": no'))
    queued = env.kube.put("api/v1", "pods", pod("q", "registry.test/q:1", node="node-b"))
    env.kube.put("api/v1", "events", event(queued, "Pulling", 'Pulling image "x"'))
    env.kube.put("api/v1", "pods", pod("nowhere", node=""))
    env.agent.views["node-a"] = node_view(
        pull("registry.test/app", progress=250, total=1000, rate=50.0))
    env.agent.views["node-b"] = node_view(pull("registry.test/o", progress=1, total=9),
                                          limit=1)
    for defs in _docs():
        code, body = await env.get("/podimagepulls")
        assert code == 200 and len(body["items"]) == 4, body
        check(body, D + "PodImagePullList", defs)
        code, one = await env.get("/namespaces/ns1/podimagepulls/web-0")
        check(one, D + "PodImagePull", defs)
        code, nodes = await env.get("/nodeimagepulls")
        assert code == 200 and nodes["items"], nodes
        check(nodes, D + "NodeImagePullList", defs)
        code, status = await env.get("/namespaces/ns1/podimagepulls/nope")
        assert code == 404
        check(status, "io.k8s.apimachinery.pkg.apis.meta.v1.Status", defs)


def test_node_imagepulls_is_an_object_its_schema_describes() -> None:
    view = node_view(pull("registry.test/app", progress=5, total=9, rate=1.0), limit=2)
    view.update(node="node-a", backend="containerd",
                kubelet={"serializeImagePulls": False, "maxParallelImagePulls": 2,
                         "parallelSlots": 2, "source": "/var/lib/kubelet/config.yaml",
                         "error": ""})
    view["presentImages"] = ["registry.test/base:1"]
    view["pulls"][0]["pods"] = [{"namespace": "ns1", "name": "w", "container": "app",
                                 "image": "registry.test/app:1"}]
    view["linkTicks"] = [[1000.0, 5]]  # the leader's link judgement reads it, not users
    body = node_pulls_object("node-a", view, "2026-01-01T00:00:00Z")
    assert "linkTicks" not in body
    assert (body["apiVersion"], body["kind"]) == ("subresources.aggapi.io/v1alpha1",
                                                  "NodeImagePulls")
    assert body["metadata"] == {"name": "node-a", "creationTimestamp": "2026-01-01T00:00:00Z"}
    # what readers of the old body read is where it was
    assert body["node"] == "node-a" and body["pulls"][0]["pods"][0]["name"] == "w"
    assert body["slots"]["limit"] == 2
    for defs in _docs():
        check(body, D + "NodeImagePulls", defs)


class _Directory:
    def __init__(self, synced: bool, nodes: set[str]) -> None:
        self._synced, self.nodes, self.waited = synced, nodes, 0.0

    @property
    def synced(self) -> bool:
        return self._synced

    async def wait_synced(self, timeout: float) -> None:
        self.waited = timeout
        raise TimeoutError

    def knows(self, node: str) -> bool:
        return node in self.nodes

    def created(self, node: str) -> str:
        return ""


async def test_an_unknown_node_is_not_found_not_unavailable() -> None:
    """At 95095d5 an unknown node was a 503 with Retry-After, which client-go retries
    ten times; nodeimagepulls says 404. (A node whose agent is not ready is still
    a 503 from the agent lookup, and before the list of agents is in, too.)"""
    with pytest.raises(StatusError) as err:
        await require_node(_Directory(True, {"node-a"}), "no-such-node")
    body = err.value.body()
    assert (body["code"], body["reason"]) == (404, "NotFound")
    assert body["message"] == 'nodes "no-such-node" not found'
    assert body["details"]["name"] == "no-such-node" and err.value.retry_after is None
    await require_node(_Directory(True, {"node-a"}), "node-a")
    before = time.monotonic()
    unsynced = _Directory(False, set())
    await require_node(unsynced, "node-x")  # not known yet: the lookup decides
    assert unsynced.waited > 0 and time.monotonic() - before < 1
