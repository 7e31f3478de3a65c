"""Discovery and OpenAPI documents, as the aggregator and kubectl read them."""

from __future__ import annotations

from typing import Any

from .conftest import GV, Server

AGG = {"X-Remote-User": "system:kube-aggregator"}


async def _json(server: Server, path: str, headers: dict[str, str] | None = None) -> Any:
    cert = server.certs.client_pair(server.certs.front_proxy_ca, "front-proxy-client")
    async with server.session(cert).get(path, headers=headers or AGG) as resp:
        assert resp.status == 200, path
        assert resp.content_type == "application/json"
        return await resp.json()


async def test_group_version_resource_list(server: Server) -> None:
    doc = await _json(server, GV)
    assert doc["kind"] == "APIResourceList" and doc["apiVersion"] == "v1"
    assert doc["groupVersion"] == "subresources.aggapi.io/v1alpha1"
    by_name = {r["name"]: r for r in doc["resources"]}
    assert set(by_name) == {"pods/imagepullprogress", "pods/copy", "nodes/imagepulls",
                            "podimagepulls", "nodeimagepulls"}
    for r in doc["resources"]:
        assert r["kind"] and r["verbs"], r
    assert by_name["pods/imagepullprogress"]["namespaced"] is True
    assert "get" in by_name["pods/imagepullprogress"]["verbs"]
    assert {"get", "create"} <= set(by_name["pods/copy"]["verbs"])
    assert by_name["nodes/imagepulls"]["namespaced"] is False
    assert by_name["nodes/imagepulls"]["verbs"] == ["get"]
    # the collections: list/watch, one namespaced (per pod), one per node
    for name, namespaced in (("podimagepulls", True), ("nodeimagepulls", False)):
        assert by_name[name]["verbs"] == ["get", "list", "watch"]
        assert by_name[name]["namespaced"] is namespaced


async def test_group_and_group_list(server: Server) -> None:
    group = await _json(server, "/apis/subresources.aggapi.io")
    assert group["kind"] == "APIGroup" and group["name"] == "subresources.aggapi.io"
    assert group["preferredVersion"] == {"groupVersion": "subresources.aggapi.io/v1alpha1",
                                         "version": "v1alpha1"}
    groups = await _json(server, "/apis")
    assert groups["kind"] == "APIGroupList" and groups["groups"] == [group]


async def test_openapi_v2(server: Server) -> None:
    doc = await _json(server, "/openapi/v2")
    assert doc["swagger"] == "2.0"
    path = GV + "/namespaces/{namespace}/pods/{name}/imagepullprogress"
    op = doc["paths"][path]["get"]
    assert [p["name"] for p in op["parameters"]] == ["namespace", "name"]
    ref = op["responses"]["200"]["schema"]["$ref"].removeprefix("#/definitions/")
    props = doc["definitions"][ref]["properties"]
    # KEP-5334's fields, with aggapi's kind, phase and attempt
    assert set(props) == {"image", "layer", "progress", "total", "error", "kind", "phase",
                          "attempt"}
    assert props["total"]["x-nullable"] is True  # unknown sizes are null
    assert GV + "/watch/namespaces/{namespace}/pods/{name}/copy" in doc["paths"]
    assert set(doc["paths"][GV + "/namespaces/{namespace}/pods/{name}/copy"]) == {
        "get", "head", "post"}
    assert GV + "/nodes/{name}/imagepulls" in doc["paths"]
    # kubectl explain finds the collections' kinds by their GVK
    kinds = {d["x-kubernetes-group-version-kind"][0]["kind"]: d
             for d in doc["definitions"].values() if "x-kubernetes-group-version-kind" in d}
    assert {"PodImagePull", "PodImagePullList", "NodeImagePull", "NodeImagePullList"} <= set(kinds)
    image = kinds["PodImagePull"]["properties"]["status"]["properties"]["images"]["items"]
    assert {"phase", "progress", "total", "bytesPerSecond", "etaSeconds", "waitingForSlot",
            "reason"} <= set(image["properties"])
    for path in ("/namespaces/{namespace}/podimagepulls", "/podimagepulls", "/nodeimagepulls",
                 "/namespaces/{namespace}/podimagepulls/{name}", "/nodeimagepulls/{name}"):
        assert GV + path in doc["paths"], path


async def test_openapi_v3_discovery_and_document(server: Server) -> None:
    index = await _json(server, "/openapi/v3")
    url = index["paths"]["apis/subresources.aggapi.io/v1alpha1"]["serverRelativeURL"]
    assert url.startswith("/openapi/v3/apis/subresources.aggapi.io/v1alpha1?hash=")
    doc = await _json(server, url)
    assert doc["openapi"].startswith("3.")
    op = doc["paths"][GV + "/namespaces/{namespace}/pods/{name}/imagepullprogress"]["get"]
    ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.removeprefix("#/components/schemas/") in doc["components"]["schemas"]


async def test_openapi_etag(server: Server) -> None:
    sess = server.session(server.certs.client_pair(server.certs.front_proxy_ca,
                                                   "front-proxy-client"))
    async with sess.get("/openapi/v2", headers=AGG) as resp:
        etag = resp.headers["ETag"]
    async with sess.get("/openapi/v2", headers={**AGG, "If-None-Match": etag}) as resp:
        assert resp.status == 304


async def test_unknown_path_is_status(server: Server) -> None:
    server.kube.sar_policy = lambda _spec: True
    cert = server.certs.client_pair(server.certs.client_ca, "carol")
    async with server.session(cert).get(GV + "/namespaces/ns1/pods/web-0/nope") as resp:
        assert resp.status == 404
        body = await resp.json()
        assert body["kind"] == "Status" and body["reason"] == "NotFound"
    async with server.session(cert).delete(GV + "/namespaces/ns1/pods/web-0/copy") as resp:
        assert resp.status == 405
        assert (await resp.json())["kind"] == "Status"
