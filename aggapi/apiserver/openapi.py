"""OpenAPI v2 and v3 documents for subresources.aggapi.io/v1alpha1.

kube-apiserver's aggregator downloads them (as itself, no authorization) and
merges them into the cluster's spec, which kubectl and client generators read.
Both are built once from one operation table; ETags let the aggregator's
periodic refresh be a 304.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from aiohttp import web

from aggapi import GROUP, VERSION, __version__
from aggapi.apiserver.discovery import (
    KIND_IMAGE_PULL_PROGRESS,
    KIND_NODE_IMAGE_PULL,
    KIND_NODE_IMAGE_PULLS,
    KIND_POD_COPY,
    KIND_POD_IMAGE_PULL,
)

PREFIX = f"/apis/{GROUP}/{VERSION}"
V3_PATH = f"apis/{GROUP}/{VERSION}"
_DEF = "io.aggapi.subresources.v1alpha1."
STATUS = "io.k8s.apimachinery.pkg.apis.meta.v1.Status"
RESOURCE_LIST = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"
JSON = "application/json"
WATCH_JSON = "application/json;stream=watch"
OCTETS = "application/octet-stream"

def _gvk(kind: str) -> list[dict[str, str]]:
    return [{"group": GROUP, "version": VERSION, "kind": kind}]


_META = {"type": "object", "description": "Standard object metadata (name, namespace, "
         "labels copied from the pod, resourceVersion)."}
_INT = {"type": "integer", "format": "int64"}
_NUM = {"type": "number", "format": "double"}
_STR = {"type": "string"}
_NULLABLE = {"x-nullable": True}


def _obj(description: str, props: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "type": "object", "properties": props}


def collection_schemas() -> dict[str, dict[str, Any]]:
    """PodImagePull and NodeImagePull, with their lists: what `kubectl explain` shows."""
    image = _obj("One image of the pod.", {
        "container": {**_STR, "description": "the container (or image volume) pulling it"},
        "image": {**_STR, "description": "the image reference"},
        "phase": {**_STR, "description": "Unscheduled, Pending, Pulling, Waiting (for a "
                  "pull slot), Resolving, Downloading, Extracting, Done, AlreadyPresent, "
                  "Failed, BackOff or Unknown"},
        "progress": {**_INT, **_NULLABLE, "description": "bytes downloaded; null: unknown"},
        "total": {**_INT, **_NULLABLE, "description": "bytes to download; null: unknown"},
        "bytesPerSecond": {**_NUM, **_NULLABLE, "description": "download rate"},
        "etaSeconds": {**_NUM, **_NULLABLE, "description": "estimated seconds left"},
        "attempt": {**_INT, "description": "pulls of the image kubelet has started"},
        "waitingForSlot": {"type": "boolean", "description": "kubelet waits for one of "
                           "the node's pull slots (maxParallelImagePulls)"},
        "slots": _obj("The node's pull slots while waiting.", {
            "used": {**_INT, **_NULLABLE}, "limit": {**_INT, **_NULLABLE}}),
        "reason": {**_STR, "description": "why the pull is stuck (Failed/BackOff): "
                   "kubelet's or the registry's words"},
        "backOffSeconds": {**_INT, "description": "kubelet's back-off before its next try"},
    })
    pod = {**_obj("Image pulls of one pod, merged from its node's agent and kubelet's "
                  "events (read-only).", {
        "apiVersion": _STR, "kind": _STR, "metadata": _META,
        "spec": _obj("Where the pod pulls.", {"nodeName": {
            **_STR, "description": "the node the pod is bound to; empty: unscheduled"}}),
        "status": _obj("The pod's pulls.", {
            "phase": {**_STR, "description": "the images' phases summed up: a failure "
                      "first, then the most advanced activity"},
            "progress": {**_INT, **_NULLABLE}, "total": {**_INT, **_NULLABLE},
            "bytesPerSecond": {**_NUM, **_NULLABLE}, "etaSeconds": {**_NUM, **_NULLABLE},
            "imagesPresent": {**_INT, "description": "images already on the node"},
            "images": {"type": "array", "items": image}})}),
           "x-kubernetes-group-version-kind": _gvk(KIND_POD_IMAGE_PULL)}
    node = {**_obj("Image pulls on one node (read-only; names every namespace's images).", {
        "apiVersion": _STR, "kind": _STR, "metadata": _META,
        "status": _obj("The node's pulls.", {
            "pulling": {**_INT, "description": "pulls in flight"},
            "slots": _obj("kubelet's pull slots.", {
                "used": {**_INT, **_NULLABLE}, "limit": {**_INT, **_NULLABLE,
                                                        "description": "null: no limit"},
                "serialize": {"type": "boolean", **_NULLABLE}}),
            "pulls": {"type": "array", "items": _obj("One in-flight pull.", {
                "images": {"type": "array", "items": _STR},
                "repositories": {"type": "array", "items": _STR},
                "phase": _STR, "progress": {**_INT, **_NULLABLE},
                "total": {**_INT, **_NULLABLE}, "bytesPerSecond": {**_NUM, **_NULLABLE},
                "startedAt": _STR})},
            "waitingPods": {"type": "array", "items": _STR,
                            "description": "namespace/name of pods waiting for a slot"},
            "linkBytesPerSecond": {**_NUM, **_NULLABLE},
            "error": _STR})}),
            "x-kubernetes-group-version-kind": _gvk(KIND_NODE_IMAGE_PULL)}
    out = {_DEF + KIND_POD_IMAGE_PULL: pod, _DEF + KIND_NODE_IMAGE_PULL: node}
    for kind in (KIND_POD_IMAGE_PULL, KIND_NODE_IMAGE_PULL):
        out[_DEF + kind + "List"] = {
            **_obj(f"A list of {kind}.", {
                "apiVersion": _STR, "kind": _STR, "metadata": {"type": "object"},
                "items": {"type": "array", "items": {"$ref": "#/definitions/" + _DEF + kind}}}),
            "x-kubernetes-group-version-kind": _gvk(kind + "List")}
    return out


SCHEMAS: dict[str, dict[str, Any]] = {
    _DEF + KIND_IMAGE_PULL_PROGRESS: {
        "description": "Pull progress of a pod, one of its images, or one layer "
                       "(KEP-5334). Streamed as a sequence of JSON objects.",
        "type": "object",
        "properties": {
            "image": {"type": "string", "description": "image reference; empty: whole pod"},
            "layer": {"type": "string", "description": "layer digest; empty: whole image"},
            "kind": {"type": "string", "description": "Progress; the stream's one final "
                     "object is Summary, Error or Timeout"},
            "phase": {"type": "string", "description": "Unscheduled, Pending, Pulling, "
                      "Waiting (at the node's pull limit), Resolving, Downloading, "
                      "Extracting, Done, AlreadyPresent, Failed, BackOff or Unknown"},
            "progress": {"type": "integer", "format": "int64", "x-nullable": True,
                         "description": "bytes so far; null when not known"},
            "total": {"type": "integer", "format": "int64", "x-nullable": True,
                      "description": "bytes expected; null when not known"},
            "attempt": {"type": "integer", "format": "int32",
                        "description": "pulls of the image kubelet has started"},
            "error": {"type": "string"},
        },
    },
    _DEF + KIND_NODE_IMAGE_PULLS: {
        "description": "Image pulls in progress on a node.",
        "type": "object",
        "properties": {"items": {"type": "array",
                                 "items": {"$ref": "#/definitions/" + _DEF
                                           + KIND_IMAGE_PULL_PROGRESS}}},
    },
    **collection_schemas(),
    STATUS: {
        "description": "Status is a return value for calls that don't return other objects.",
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"},
            "metadata": {"type": "object"}, "status": {"type": "string"},
            "message": {"type": "string"}, "reason": {"type": "string"},
            "details": {"type": "object"}, "code": {"type": "integer", "format": "int32"},
        },
    },
    RESOURCE_LIST: {
        "description": "APIResourceList is a list of APIResource.",
        "type": "object",
        "required": ["groupVersion", "resources"],
        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                       "groupVersion": {"type": "string"},
                       "resources": {"type": "array", "items": {"type": "object"}}},
    },
}

_NS: dict[str, Any] = {"name": "namespace", "in": "path", "required": True, "type": "string",
       "description": "object name and auth scope, such as for teams and projects"}
_POD: dict[str, Any] = {"name": "name", "in": "path", "required": True, "type": "string",
        "description": "name of the Pod"}
_NODE: dict[str, Any] = {"name": "name", "in": "path", "required": True, "type": "string",
         "description": "name of the Node"}
_CONTAINER: dict[str, Any] = {"name": "container", "in": "query", "type": "string",
              "description": "container name; defaults to the only container"}
_COPY_PATH: dict[str, Any] = {"name": "path", "in": "query", "required": True, "type": "string",
              "description": "absolute path inside the container"}


_LIST_PARAMS: list[dict[str, Any]] = [
    {"name": n, "in": "query", "type": t, "description": d} for n, t, d in (
        ("labelSelector", "string", "select by the pod's labels"),
        ("fieldSelector", "string", "metadata.name, metadata.namespace, spec.nodeName "
                                    "(podimagepulls) or metadata.name (nodeimagepulls)"),
        ("watch", "boolean", "stream ADDED/MODIFIED/DELETED events"),
        ("resourceVersion", "string", "watch from this version (410 when too old)"),
        ("allowWatchBookmarks", "boolean", "send BOOKMARK events"),
        ("timeoutSeconds", "integer", "end the watch after this long"))]


def _op(op_id: str, desc: str, *, params: list[dict[str, Any]], produces: list[str],
        schema: str | None, consumes: list[str] | None = None,
        action: str = "") -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK"}
    if schema:
        ok["schema"] = {"$ref": "#/definitions/" + schema}
    else:
        ok["schema"] = {"type": "string", "format": "binary"}
    op: dict[str, Any] = {
        "operationId": op_id, "description": desc, "tags": [f"subresources_{VERSION}"],
        "parameters": params, "produces": produces, "schemes": ["https"],
        "responses": {"200": ok, "401": {"description": "Unauthorized",
                                         "schema": {"$ref": "#/definitions/" + STATUS}},
                      "403": {"description": "Forbidden",
                              "schema": {"$ref": "#/definitions/" + STATUS}}},
        "x-kubernetes-group-version-kind": {"group": GROUP, "version": VERSION,
                                            "kind": schema.rsplit(".", 1)[-1]
                                            if schema else KIND_POD_COPY},
    }
    if consumes:
        op["consumes"] = consumes
    if action:
        op["x-kubernetes-action"] = action
    return op


def _paths() -> dict[str, dict[str, Any]]:
    pod = PREFIX + "/namespaces/{namespace}/pods/{name}"
    watch_pod = PREFIX + "/watch/namespaces/{namespace}/pods/{name}"
    progress = _DEF + KIND_IMAGE_PULL_PROGRESS
    paths: dict[str, dict[str, Any]] = {
        PREFIX + "/": {"get": {
            "operationId": f"getSubresourcesAggapiIo{VERSION.capitalize()}APIResources",
            "description": "get available resources", "produces": [JSON],
            "schemes": ["https"], "tags": [f"subresources_{VERSION}"],
            "responses": {"200": {"description": "OK",
                                  "schema": {"$ref": "#/definitions/" + RESOURCE_LIST}}}}},
        PREFIX + "/nodes/{name}/imagepulls": {"get": _op(
            "readNodeImagePulls", "image pulls in progress on a node", params=[_NODE],
            produces=[JSON], schema=_DEF + KIND_NODE_IMAGE_PULLS)},
    }
    for kind, plural, namespaced in ((KIND_POD_IMAGE_PULL, "podimagepulls", True),
                                     (KIND_NODE_IMAGE_PULL, "nodeimagepulls", False)):
        ns = "Namespaced" if namespaced else ""
        scope = PREFIX + ("/namespaces/{namespace}" if namespaced else "")
        one = [_NS, _POD] if namespaced else [_NODE]
        coll = [_NS] if namespaced else []
        paths[f"{scope}/{plural}"] = {"get": _op(
            f"list{ns}{kind}", f"list or watch (watch=true) {plural}",
            params=coll + _LIST_PARAMS, produces=[JSON, WATCH_JSON],
            schema=_DEF + kind + "List", action="list")}
        paths[f"{scope}/{plural}/{{name}}"] = {"get": _op(
            f"read{ns}{kind}", f"read the {kind}", params=one, produces=[JSON],
            schema=_DEF + kind, action="get")}
        if namespaced:
            paths[f"{PREFIX}/{plural}"] = {"get": _op(
                f"list{kind}ForAllNamespaces", f"list or watch {plural} of every namespace",
                params=_LIST_PARAMS, produces=[JSON, WATCH_JSON], schema=_DEF + kind + "List",
                action="list")}
    for base, verb in ((pod, ""), (watch_pod, "Watch")):
        paths[base + "/imagepullprogress"] = {"get": _op(
            f"{verb.lower() or 'read'}PodImagePullProgress",
            "image pull progress of a pod; streams while pulls run", params=[_NS, _POD],
            produces=[JSON, WATCH_JSON], schema=progress)}
        copy_params = [_NS, _POD, _CONTAINER, _COPY_PATH]
        paths[base + "/copy"] = {
            "get": _op(f"{verb.lower() or 'connect'}GetPodCopy",
                       "copy a file or directory out of a container", params=copy_params,
                       produces=[OCTETS], schema=None),
            "head": _op(f"{verb.lower() or 'connect'}HeadPodCopy",
                        "size and checksum of a path in a container", params=copy_params,
                        produces=[OCTETS], schema=None),
            "post": _op(f"{verb.lower() or 'connect'}PostPodCopy",
                        "copy a file or directory into a container", params=copy_params,
                        produces=[JSON], consumes=[OCTETS], schema=STATUS),
        }
    return paths


@functools.cache
def v2_document() -> dict[str, Any]:
    return {"swagger": "2.0",
            "info": {"title": "aggapi", "version": __version__},
            "paths": _paths(), "definitions": SCHEMAS}


def _v3_param(p: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in p.items() if k not in ("type",)}
    out["schema"] = {"type": p["type"]}
    return out


def _v3_op(op: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in op.items() if k not in ("produces", "consumes", "schemes")}
    out["parameters"] = [_v3_param(p) for p in op.get("parameters", [])]
    responses: dict[str, Any] = {}
    for code, resp in op["responses"].items():
        schema = _v3_schema(resp["schema"])
        types = op.get("produces", [JSON]) if code == "200" else [JSON]
        responses[code] = {"description": resp["description"],
                           "content": {t: {"schema": schema} for t in types}}
    out["responses"] = responses
    if "consumes" in op:
        out["requestBody"] = {"content": {t: {"schema": {"type": "string", "format": "binary"}}
                                          for t in op["consumes"]}}
    return out


def _v3_schema(schema: Any) -> Any:
    if isinstance(schema, dict):
        out = {k: (v.replace("#/definitions/", "#/components/schemas/")
                   if k == "$ref" else _v3_schema(v)) for k, v in schema.items()}
        if out.get("x-nullable") is True:  # v2's extension is v3's keyword
            out["nullable"] = True
        return out
    if isinstance(schema, list):
        return [_v3_schema(s) for s in schema]
    return schema


@functools.cache
def v3_document() -> dict[str, Any]:
    return {"openapi": "3.0.0",
            "info": {"title": "aggapi", "version": __version__},
            "paths": {p: {m: _v3_op(op) for m, op in ops.items()}
                      for p, ops in _paths().items()},
            "components": {"schemas": _v3_schema(SCHEMAS)}}


@functools.cache
def _encoded(which: str) -> tuple[bytes, str]:
    doc = v2_document() if which == "v2" else v3_document()
    body = json.dumps(doc, sort_keys=True).encode()
    return body, hashlib.sha512(body).hexdigest()[:32].upper()


def _serve(request: web.Request, which: str, *, immutable: bool = False) -> web.Response:
    body, digest = _encoded(which)
    etag = f'"{digest}"'
    headers = {"ETag": etag, "Vary": "Accept"}
    if immutable:
        headers["Cache-Control"] = "public, immutable"
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=body, content_type=JSON, headers=headers)


async def openapi_v2(request: web.Request) -> web.Response:
    return _serve(request, "v2")


async def openapi_v3_discovery(_request: web.Request) -> web.Response:
    _, digest = _encoded("v3")
    return web.json_response({"paths": {V3_PATH: {
        "serverRelativeURL": f"/openapi/v3/{V3_PATH}?hash={digest}"}}})


async def openapi_v3_group_version(request: web.Request) -> web.Response:
    _, digest = _encoded("v3")
    return _serve(request, "v3", immutable=request.query.get("hash") == digest)
