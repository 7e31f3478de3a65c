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
    assert [p["name"] for p in op["parameters"]] == ["namespace", "name", "follow",
                                                     "granularity", "container"]
    ref = op["responses"]["200"]["schema"]["$ref"].removeprefix("#/definitions/")
    props = doc["definitions"][ref]["properties"]
    # KEP-5334's fields, with aggapi's kind, phase and attempt
    assert {"image", "layer", "progress", "total", "error", "kind", "phase",
            "attempt"} <= set(props)
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


def _refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        out = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return out.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


async def test_openapi_metadata_is_object_meta_and_lists_take_kubes_parameters(
        server: Server) -> None:
    """At 95095d5 metadata was a bare object (kubectl explain showed no fields), lists
    had no ListMeta, and the list paths lacked limit, continue, resourceVersionMatch
    and sendInitialEvents; nodes/imagepulls' schema named an ``items`` it never sent."""
    meta = "io.k8s.apimachinery.pkg.apis.meta.v1."
    v2 = await _json(server, "/openapi/v2")
    defs = v2["definitions"]
    for kind in ("PodImagePull", "NodeImagePull", "NodeImagePulls"):
        md = defs["io.aggapi.subresources.v1alpha1." + kind]["properties"]["metadata"]
        assert md.get("$ref", "") == "#/definitions/" + meta + "ObjectMeta", kind
    for kind in ("PodImagePullList", "NodeImagePullList"):
        md = defs["io.aggapi.subresources.v1alpha1." + kind]["properties"]["metadata"]
        assert md["$ref"] == "#/definitions/" + meta + "ListMeta"
    om = defs[meta + "ObjectMeta"]["properties"]
    assert {"name", "namespace", "uid", "labels", "resourceVersion", "creationTimestamp",
            "annotations", "ownerReferences", "managedFields"} <= set(om)
    assert "continue" in defs[meta + "ListMeta"]["properties"]
    assert "items" not in defs["io.aggapi.subresources.v1alpha1.NodeImagePulls"]["properties"]
    want = {"watch", "labelSelector", "fieldSelector", "resourceVersion",
            "resourceVersionMatch", "limit", "continue", "timeoutSeconds",
            "allowWatchBookmarks", "sendInitialEvents"}
    for path in ("/namespaces/{namespace}/podimagepulls", "/podimagepulls", "/nodeimagepulls"):
        names = {p["name"] for p in v2["paths"][GV + path]["get"]["parameters"]}
        assert want <= names, path
    assert "404" in v2["paths"][GV + "/nodes/{name}/imagepulls"]["get"]["responses"]
    copy = v2["paths"][GV + "/namespaces/{namespace}/pods/{name}/copy"]
    assert {"symlink", "digest"} <= {p["name"] for p in copy["get"]["parameters"]}
    assert {"sha256", "format"} <= {p["name"] for p in copy["post"]["parameters"]}
    # each document stands alone: every $ref resolves in it (kubectl reads the v3
    # document of one group-version)
    assert {r.removeprefix("#/definitions/") for r in _refs(v2)} <= set(defs)
    index = await _json(server, "/openapi/v3")
    v3 = await _json(server, index["paths"]["apis/subresources.aggapi.io/v1alpha1"][
        "serverRelativeURL"])
    comps = v3["components"]["schemas"]
    assert {r.removeprefix("#/components/schemas/") for r in _refs(v3)} <= set(comps)
    pip = comps["io.aggapi.subresources.v1alpha1.PodImagePull"]["properties"]["metadata"]
    assert pip["$ref"] == "#/components/schemas/" + meta + "ObjectMeta"
    limit = next(p for p in v3["paths"][GV + "/podimagepulls"]["get"]["parameters"]
                 if p["name"] == "limit")
    assert limit["schema"]["type"] == "integer" and limit["in"] == "query"
