"""The route table: every path, its handler, and the authorization it needs.

Authorization is declared here, beside each route, and enforced by the authz
layer (``authz.py``) before any handler runs. A route's ``Authz`` says which
SubjectAccessReviews the request needs beyond (or instead of) its own
attributes; handlers never authorize.

Each subresource is also served under ``/watch/``: kube-apiserver then treats it
as long-running (verb watch) and does not cut it at --request-timeout. On that
path the verb no longer says what the request does, hence ``operation_verb``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractRoute

from aggapi import GROUP
from aggapi.apiserver import discovery, health, openapi
from aggapi.apiserver.authz import OPEN, OWN, Also, Authz, default_authz
from aggapi.apiserver.collections.handler import NODES, PODS, CollectionHandler
from aggapi.apiserver.handlers.copy import CopyHandler
from aggapi.apiserver.imagepullprogress.handler import SEE_NODE_PULLS, PodProgressHandler
from aggapi.apiserver.imagepullprogress.nodeview import NodePullsHandler
from aggapi.apiserver.metrics import metrics_handler
from aggapi.apiserver.parts import Parts
from aggapi.apiserver.replicas import LeaderRouted
from aggapi.apiserver.requestinfo import INFO
from aggapi.status import Handler
from aggapi.wire import GROUP_VERSION_PATH as GV

POD = "/namespaces/{namespace}/pods/{name}"
READ = ("GET", "HEAD")

# Copying is as strong as running a command in the container, both ways: a read
# reaches projected ServiceAccount tokens and mounted Secrets, which read-everything
# roles (get/list/watch on "*") must not open (Kubernetes moved exec to `create` for
# the same reason). Every copy operation (GET, HEAD, POST) also needs what
# `kubectl exec` needs, unless --copy-require-exec=false.
EXEC_FOR_COPY = Also(verb="create", group="", version="v1", resource="pods",
                     subresource="exec", methods=frozenset({"GET", "HEAD", "POST"}))
# pods/imagepullprogress shows other pods' pulls on the node (other namespaces'
# images) only to whoever may read the node's pulls themselves.
PROGRESS_AUTHZ = Authz(optional=(SEE_NODE_PULLS,))


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]
    path: str
    handler: Handler
    authz: Authz = OWN


def copy_authz(require_exec: bool) -> Authz:
    """pods/copy: the request's verb, the operation's verb (get to read, create to
    write), and for every operation ``create`` on core pods/exec."""
    return Authz(operation_verb=True, also=(EXEC_FOR_COPY,) if require_exec else ())


def route_table(parts: Parts) -> list[Route]:
    cfg = parts.config
    progress = PodProgressHandler(parts.agent, parts.pod_watches, parts.progress_streams,
                                  parts.lifecycle, stream_deadline=cfg.stream_deadline)
    copy = CopyHandler(parts.kube_api, parts.agent, parts.lifecycle.copies)
    ready = health.readyz(parts.auth_source, parts.lifecycle, parts.agent,
                          parts.feeds.complete)
    table = [
        Route(("GET",), "/healthz", health.healthz, OPEN),
        Route(("GET",), "/livez", health.healthz, OPEN),
        Route(("GET",), "/readyz", ready, OPEN),
        # A non-resource check of /metrics unless --always-allow-metrics.
        Route(("GET",), "/metrics", metrics_handler(parts.metrics, parts.fleet.refresh),
              OPEN if cfg.always_allow_metrics else OWN),
        # Discovery and OpenAPI: the aggregator fetches them as itself.
        Route(("GET",), "/apis", discovery.apis, OPEN),
        Route(("GET",), f"/apis/{GROUP}", discovery.group, OPEN),
        Route(("GET",), GV, discovery.group_version, OPEN),
        Route(("GET",), "/openapi/v2", openapi.openapi_v2, OPEN),
        Route(("GET",), "/openapi/v3", openapi.openapi_v3_discovery, OPEN),
        Route(("GET",), f"/openapi/v3/{openapi.V3_PATH}", openapi.openapi_v3_group_version,
              OPEN),
        Route(READ, f"{GV}/nodes/{{name}}/imagepulls", NodePullsHandler(parts.kube_api,
                                                                          parts.agent)),
    ]
    # Served by the replica that leads the collections, forwarded to it by the others.
    def term() -> int | None:
        return parts.feeds.term
    pod_pulls = LeaderRouted(CollectionHandler(PODS, parts.feeds, parts.lifecycle),
                             parts.election, parts.forwarder, term)
    node_pulls = LeaderRouted(CollectionHandler(NODES, parts.feeds, parts.lifecycle),
                              parts.election, parts.forwarder, term)
    for prefix in (GV, f"{GV}/watch"):
        # The collections: get/list/watch as the request's own attributes say
        # (a namespaced list authorizes that namespace, an all-namespaces one the
        # cluster); nodeimagepulls is cluster-scoped.
        table += [
            Route(("GET",), f"{prefix}/{PODS.name}", pod_pulls),
            Route(("GET",), f"{prefix}/namespaces/{{namespace}}/{PODS.name}", pod_pulls),
            Route(("GET",), f"{prefix}/namespaces/{{namespace}}/{PODS.name}/{{name}}",
                  pod_pulls),
            Route(("GET",), f"{prefix}/{NODES.name}", node_pulls),
            Route(("GET",), f"{prefix}/{NODES.name}/{{name}}", node_pulls),
        ]
        table += [
            Route(READ, f"{prefix}{POD}/imagepullprogress", progress, PROGRESS_AUTHZ),
            Route((*READ, "POST"), f"{prefix}{POD}/copy", copy,
                  copy_authz(cfg.copy_require_exec)),
        ]
    return table


def install(router: web.UrlDispatcher,
            table: list[Route]) -> Callable[[web.Request], Authz]:
    """Add the routes; returns what the authz layer asks for a request's Authz."""
    declared: dict[AbstractRoute, Authz] = {}
    for route in table:
        # aiohttp wants a coroutine function: a handler object's bound __call__ is one.
        obj: Any = route.handler
        handler: Handler = obj if inspect.iscoroutinefunction(obj) else obj.__call__
        for method in route.methods:
            declared[router.add_route(method, route.path, handler)] = route.authz

    def authz_of(request: web.Request) -> Authz:
        authz = declared.get(request.match_info.route)
        return authz if authz is not None else default_authz(request[INFO])

    return authz_of
