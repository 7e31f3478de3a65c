"""API discovery documents: /apis, /apis/G and /apis/G/V (the aggregator's availability probe)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from aggapi import GROUP, GROUP_VERSION, VERSION

# Kinds named after kube's own subresource conventions (pods/exec -> PodExecOptions).
KIND_IMAGE_PULL_PROGRESS = "ImagePullProgress"
KIND_POD_COPY = "PodCopyOptions"
KIND_NODE_IMAGE_PULLS = "NodeImagePulls"
KIND_POD_IMAGE_PULL = "PodImagePull"
KIND_NODE_IMAGE_PULL = "NodeImagePull"

# Verbs as RBAC sees them: the /watch/ path prefix turns any method into "watch".
RESOURCES: list[dict[str, Any]] = [
    {"name": "pods/imagepullprogress", "singularName": "", "namespaced": True,
     "kind": KIND_IMAGE_PULL_PROGRESS, "verbs": ["get", "watch"]},
    {"name": "pods/copy", "singularName": "", "namespaced": True,
     "kind": KIND_POD_COPY, "verbs": ["create", "get", "watch"]},
    {"name": "nodes/imagepulls", "singularName": "", "namespaced": False,
     "kind": KIND_NODE_IMAGE_PULLS, "verbs": ["get"]},
    # The read-only collections (one object per pod, per node), like metrics.k8s.io's.
    {"name": "podimagepulls", "singularName": "podimagepull", "namespaced": True,
     "kind": KIND_POD_IMAGE_PULL, "verbs": ["get", "list", "watch"], "shortNames": ["pip"]},
    {"name": "nodeimagepulls", "singularName": "nodeimagepull", "namespaced": False,
     "kind": KIND_NODE_IMAGE_PULL, "verbs": ["get", "list", "watch"],
     "shortNames": ["nip"]},
]


def api_group() -> dict[str, Any]:
    gv = {"groupVersion": GROUP_VERSION, "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": [gv],
            "preferredVersion": gv}


def api_resource_list() -> dict[str, Any]:
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": GROUP_VERSION,
            "resources": RESOURCES}


async def apis(_request: web.Request) -> web.Response:
    return web.json_response({"kind": "APIGroupList", "apiVersion": "v1",
                              "groups": [api_group()]})


async def group(_request: web.Request) -> web.Response:
    return web.json_response(api_group())


async def group_version(_request: web.Request) -> web.Response:
    return web.json_response(api_resource_list())
