"""Authorization by SubjectAccessReview, cached, failing closed.

Every resource request is checked with its real attributes (verb as
kube-apiserver derives it, group, version, resource, subresource, namespace,
name) and the caller's full identity. Discovery, OpenAPI and probes are open, as
kube-apiserver's aggregator fetches them as itself; /metrics is a non-resource
check unless --always-allow-metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aggapi.apiserver import appkeys
from aggapi.apiserver.cache import TTLCache
from aggapi.apiserver.metrics import Metrics
from aggapi.apiserver.requestinfo import RequestInfo
from aggapi.apiserver.user import UserInfo
from aggapi.kube import KubeClient
from aggapi.status import Handler, StatusError, forbidden

log = logging.getLogger(__name__)

SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"

OPEN_PREFIXES = ("/openapi/",)
OPEN_PATHS = frozenset({"/healthz", "/livez", "/readyz", "/apis", "/openapi/v2",
                        "/openapi/v3"})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class AuthorizationError(Exception):
    """The authorizer could not decide (SAR failed): never an allow."""


class Authorizer:
    def __init__(self, api: KubeClient, metrics: Metrics, *, allow_ttl: float = 10.0,
                 deny_ttl: float = 10.0, maxsize: int = 10000, timeout: float = 5.0) -> None:
        self.api = api
        self.metrics = metrics
        self.allow_ttl = allow_ttl
        self.deny_ttl = deny_ttl
        self.timeout = timeout
        self.cache: TTLCache[Decision] = TTLCache(maxsize)

    async def authorize(self, user: UserInfo, attrs: RequestInfo) -> Decision:
        """Raises AuthorizationError when no decision could be had."""
        key = (user.key(), _attrs_key(attrs))
        decision, cached = await self.cache.get_or_load(
            key, lambda: self._review(user, attrs),
            lambda d: self.allow_ttl if d.allowed else self.deny_ttl)
        self.metrics.sar_cache.labels("hit" if cached else "miss").inc()
        return decision

    async def _review(self, user: UserInfo, attrs: RequestInfo) -> Decision:
        body = sar_body(user, attrs)
        try:
            resp = await self.api.post(SUBJECTACCESSREVIEWS, body, timeout=self.timeout)
        except Exception as exc:
            self.metrics.sar.labels("error").inc()
            log.warning("SubjectAccessReview failed: %s", exc)
            raise AuthorizationError(str(exc)) from exc
        status = resp.get("status") or {}
        allowed = bool(status.get("allowed") and not status.get("denied"))
        reason = str(status.get("reason") or status.get("evaluationError") or "")
        self.metrics.sar.labels("allowed" if allowed else "denied").inc()
        return Decision(allowed, reason)


def _attrs_key(a: RequestInfo) -> tuple[object, ...]:
    if a.is_resource_request:
        return (a.verb, a.api_group, a.api_version, a.resource, a.subresource,
                a.namespace, a.name)
    return ("nonresource", a.verb, a.path)


def sar_body(user: UserInfo, attrs: RequestInfo) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "user": user.name,
        "groups": list(user.groups),
        "extra": {k: list(v) for k, v in user.extra.items()},
    }
    if user.uid:
        spec["uid"] = user.uid
    if attrs.is_resource_request:
        spec["resourceAttributes"] = {
            "namespace": attrs.namespace, "verb": attrs.verb, "group": attrs.api_group,
            "version": attrs.api_version, "resource": attrs.resource,
            "subresource": attrs.subresource, "name": attrs.name,
        }
    else:
        spec["nonResourceAttributes"] = {"path": attrs.path, "verb": attrs.verb}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}


def needs_authorization(request: web.Request, info: RequestInfo) -> bool:
    path = request.path
    if path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return False
    if path == "/metrics":
        return not request.app[appkeys.CONFIG].always_allow_metrics
    # /apis/G and /apis/G/V are discovery: non-resource paths under /apis.
    return info.is_resource_request or not path.startswith("/apis")


async def check(request: web.Request, user: UserInfo, attrs: RequestInfo) -> None:
    """Raise the Status kube-apiserver would answer unless ``attrs`` is allowed.

    Handlers use it for additional checks (e.g. ``create`` on core pods/exec)."""
    authorizer = request.app[appkeys.AUTHORIZER]
    try:
        decision = await authorizer.authorize(user, attrs)
    except AuthorizationError as exc:
        raise StatusError(503, "authorization is temporarily unavailable",
                          retry_after=1) from exc
    if decision.allowed:
        return
    if attrs.is_resource_request:
        resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource \
            else attrs.resource
        raise forbidden(user.name, attrs.verb, resource, group=attrs.api_group,
                        namespace=attrs.namespace, name=attrs.name, reason=decision.reason)
    msg = f'forbidden: User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
    if decision.reason:
        msg += f": {decision.reason}"
    raise StatusError(403, msg)


@web.middleware
async def authz_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    info = request[appkeys.INFO]
    if needs_authorization(request, info):
        await check(request, request[appkeys.USER], info)
    return await handler(request)
