"""Request attributes derived from method and path as kube-apiserver's RequestInfoFactory does.

The verb matters twice: it is what SubjectAccessReview checks, and kube-apiserver
treats verb ``watch`` (the ``/apis/G/V/watch/...`` prefix, any method) as
long-running, so the aggregator does not cut it at --request-timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from aggapi.apiserver import appkeys
from aggapi.status import Handler

_METHOD_VERBS = {
    "GET": "get", "HEAD": "get", "POST": "create", "PUT": "update",
    "PATCH": "patch", "DELETE": "delete",
}
_API_PREFIXES = ("api", "apis")


@dataclass(frozen=True)
class RequestInfo:
    verb: str
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    is_resource_request: bool = False
    path: str = ""


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


def parse(method: str, path: str, query: Mapping[str, str] | None = None) -> RequestInfo:
    query = query or {}
    method = method.upper()
    parts = [p for p in path.strip("/").split("/") if p] if path.strip("/") else []
    non_resource = RequestInfo(verb=method.lower(), path=path)
    if not parts or parts[0] not in _API_PREFIXES:
        return non_resource
    parts = parts[1:]
    group = ""
    if path.strip("/").split("/")[0] == "apis":
        if len(parts) < 3:  # /apis, /apis/G, /apis/G/V: discovery
            return non_resource
        group, parts = parts[0], parts[1:]
    elif len(parts) < 2:  # /api, /api/v1
        return non_resource
    version, parts = parts[0], parts[1:]

    verb = ""
    if parts[0] == "watch":
        verb, parts = "watch", parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, method.lower())

    namespace = ""
    if parts and parts[0] == "namespaces":
        if len(parts) > 1:
            namespace = parts[1]
            # /namespaces/N alone is the namespace object itself.
            if len(parts) > 2:
                parts = parts[2:]
    resource = parts[0] if parts else ""
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""

    if not name and verb == "get":
        verb = "watch" if _truthy(query.get("watch")) else "list"
    elif not name and verb == "delete":
        verb = "deletecollection"
    return RequestInfo(verb=verb, api_group=group, api_version=version, namespace=namespace,
                       resource=resource, subresource=subresource, name=name,
                       is_resource_request=True, path=path)


@web.middleware
async def requestinfo_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request[appkeys.INFO] = parse(request.method, request.path, request.query)
    return await handler(request)
