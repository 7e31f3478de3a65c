"""OpenAPI v2 and v3 documents for subresources.aggapi.io/v1alpha1.

kube-apiserver's aggregator downloads them (as itself, no authorization) and
merges them into the cluster's spec, which kubectl and client generators read.
Both are built once from one operation table (the definitions: ``apischemas``);
ETags let the aggregator's periodic refresh be a 304.
"""

from __future__ import annotations

import functools
import hashlib
import json
from typing import Any

from aiohttp import web

from aggapi import GROUP, VERSION, __version__
from aggapi.apiserver.apischemas import DEF, RESOURCE_LIST, STATUS, schemas
from aggapi.apiserver.discovery import (
    KIND_IMAGE_PULL_PROGRESS,
    KIND_NODE_IMAGE_PULL,
    KIND_NODE_IMAGE_PULLS,
    KIND_POD_COPY,
    KIND_POD_IMAGE_PULL,
)
from aggapi.wire import PARAM_CONTAINER, PARAM_DIGEST, PARAM_PATH, PARAM_SYMLINK

PREFIX = f"/apis/{GROUP}/{VERSION}"
V3_PATH = f"apis/{GROUP}/{VERSION}"
_DEF = DEF
JSON = "application/json"
WATCH_JSON = "application/json;stream=watch"
OCTETS = "application/octet-stream"
SCHEMAS: dict[str, dict[str, Any]] = schemas()


def _param(name: str, type_: str, description: str, *, where: str = "query",
           required: bool = False, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "in": where, "type": type_,
                           "description": description, **extra}
    if required:
        out["required"] = True
    return out


_NS = _param("namespace", "string", "object name and auth scope, such as for teams and "
             "projects", where="path", required=True, uniqueItems=True)
_POD = _param("name", "string", "name of the Pod", where="path", required=True,
              uniqueItems=True)
_NODE = _param("name", "string", "name of the Node", where="path", required=True,
               uniqueItems=True)
_CONTAINER = _param(PARAM_CONTAINER, "string", "container name; defaults to the only "
                    "container", uniqueItems=True)
_COPY_PATH = _param(PARAM_PATH, "string", "absolute path inside the container (or relative "
                    "to the container process's working directory)", required=True,
                    uniqueItems=True)
_DOWNLOAD = [
    _param(PARAM_SYMLINK, "string", "keep: answer a symlink with the link itself; "
           "otherwise a symlink is a 409", enum=["keep"], uniqueItems=True),
    _param(PARAM_DIGEST, "string", "trailer: the file's sha256 after its data",
           enum=["trailer"], uniqueItems=True)]
_UPLOAD = [_param(n, "string", d, uniqueItems=True) for n, d in (
    ("overwrite", "true to replace an existing file"),
    ("mode", "permission bits of the new file, octal"),
    ("uid", "owner of the new file"), ("gid", "group of the new file"),
    ("sha256", "the body's sha256 (64 hex digits), or trailer, headers:<hex>, "
               "headers-trailer"),
    ("format", "raw (one file) or tar (a directory)"))]
_PROGRESS = [
    _param("follow", "boolean", "follow the pulls until every image is present "
           "(default true); false: one snapshot", uniqueItems=True),
    _param("granularity", "string", "layer (default), image or pod",
           enum=["layer", "image", "pod"], uniqueItems=True),
    _param(PARAM_CONTAINER, "array", "only these containers (repeat the parameter); "
           "default: all", items={"type": "string"}, collectionFormat="multi")]
# What the list and watch of a collection take, as kube-apiserver names them.
_LIST_PARAMS: list[dict[str, Any]] = [_param(n, t, d, uniqueItems=True) for n, t, d in (
    ("allowWatchBookmarks", "boolean", "send BOOKMARK events"),
    ("continue", "string", "the continue token of the previous page"),
    ("fieldSelector", "string", "metadata.name, metadata.namespace, spec.nodeName "
                                "(podimagepulls) or metadata.name (nodeimagepulls); "
                                "=, == and !="),
    ("labelSelector", "string", "select by the pod's labels"),
    ("limit", "integer", "at most this many items; the list's metadata.continue "
                         "fetches the next page"),
    ("resourceVersion", "string", "list at, or watch from, this version (410 when too old)"),
    ("resourceVersionMatch", "string", "NotOlderThan or Exact, with resourceVersion"),
    ("sendInitialEvents", "boolean", "a watch starts with the current state as ADDED "
                                     "events, then a BOOKMARK"),
    ("timeoutSeconds", "integer", "end the list or watch after this long"),
    ("watch", "boolean", "stream ADDED/MODIFIED/DELETED events"))]


def _op(op_id: str, desc: str, *, params: list[dict[str, Any]], produces: list[str],
        schema: str | None, consumes: list[str] | None = None,
        action: str = "", not_found: bool = False) -> dict[str, Any]:
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
    if not_found:
        op["responses"]["404"] = {"description": "Not Found (a Status naming the object)",
                                  "schema": {"$ref": "#/definitions/" + STATUS}}
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
            produces=[JSON], schema=_DEF + KIND_NODE_IMAGE_PULLS, not_found=True)},
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
            schema=_DEF + kind, action="get", not_found=True)}
        if namespaced:
            paths[f"{PREFIX}/{plural}"] = {"get": _op(
                f"list{kind}ForAllNamespaces", f"list or watch {plural} of every namespace",
                params=_LIST_PARAMS, produces=[JSON, WATCH_JSON], schema=_DEF + kind + "List",
                action="list")}
    for base, verb in ((pod, ""), (watch_pod, "Watch")):
        paths[base + "/imagepullprogress"] = {"get": _op(
            f"{verb.lower() or 'read'}PodImagePullProgress",
            "image pull progress of a pod; streams while pulls run",
            params=[_NS, _POD, *_PROGRESS], produces=[JSON, WATCH_JSON], schema=progress,
            not_found=True)}
        copy_params = [_NS, _POD, _CONTAINER, _COPY_PATH]
        paths[base + "/copy"] = {
            "get": _op(f"{verb.lower() or 'connect'}GetPodCopy",
                       "copy a file or directory out of a container",
                       params=copy_params + _DOWNLOAD, produces=[OCTETS], schema=None),
            "head": _op(f"{verb.lower() or 'connect'}HeadPodCopy",
                        "size and checksum of a path in a container", params=copy_params,
                        produces=[OCTETS], schema=None),
            "post": _op(f"{verb.lower() or 'connect'}PostPodCopy",
                        "copy a file or directory into a container",
                        params=copy_params + _UPLOAD, produces=[JSON], consumes=[OCTETS],
                        schema=STATUS),
        }
    return paths


@functools.cache
def v2_document() -> dict[str, Any]:
    return {"swagger": "2.0",
            "info": {"title": "aggapi", "version": __version__},
            "paths": _paths(), "definitions": SCHEMAS}


_V2_ONLY = ("type", "items", "enum", "collectionFormat", "uniqueItems")


def _v3_param(p: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in p.items() if k not in _V2_ONLY}
    out["schema"] = {k: p[k] for k in ("type", "items", "enum", "uniqueItems") if k in p}
    if p.get("collectionFormat") == "multi":
        out["style"], out["explode"] = "form", True
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
