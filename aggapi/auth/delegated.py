"""Delegated authentication and authorization: TokenReview and SubjectAccessReview.

What k8s.io/apiserver calls "delegating" authn/authz, shared by both servers: the
apiserver builds its authenticator and authorizer on these, and the agent guards
its metrics port with :func:`nonresource_guard` the way kube-rbac-proxy and
metrics-server do (a bearer token -> TokenReview, then a SubjectAccessReview on
the non-resource URL). Answers are cached (10 s by default, keyed by the token's
digest, never the token), and concurrent misses share one review.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import Counter

from aggapi.auth.ttlcache import TTLCache
from aggapi.kube.client import KubeClient
from aggapi.status import Handler, StatusError

log = logging.getLogger(__name__)

TOKENREVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECTACCESSREVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
ANONYMOUS = "system:anonymous"
AUTHENTICATED = "system:authenticated"


@dataclass(frozen=True)
class UserInfo:
    """An authenticated identity (k8s.io/apiserver's user.Info)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    @property
    def is_anonymous(self) -> bool:
        return self.name == ANONYMOUS

    def key(self) -> tuple[object, ...]:
        """A hashable identity for caches (extra included)."""
        return (self.name, self.uid, self.groups,
                tuple(sorted((k, tuple(v)) for k, v in self.extra.items())))

    def with_authenticated(self) -> UserInfo:
        """kube-apiserver adds system:authenticated to every authenticated user."""
        if AUTHENTICATED in self.groups:
            return self
        return UserInfo(self.name, self.uid, (*self.groups, AUTHENTICATED), self.extra)


class ReviewMetrics(Protocol):
    """The counters a server keeps of its reviews (each labelled by ``result``)."""

    tokenreview: Counter
    token_cache: Counter
    sar: Counter
    sar_cache: Counter


class AuthenticationFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class TokenReviewer:
    def __init__(self, api: KubeClient, metrics: ReviewMetrics, *, ttl: float = 10.0,
                 maxsize: int = 10000, timeout: float = 5.0) -> None:
        self.api = api
        self.metrics = metrics
        self.ttl = ttl
        self.timeout = timeout
        # Keyed by the token's digest: the cache never holds credentials.
        self.cache: TTLCache[UserInfo | str] = TTLCache(maxsize)

    async def review(self, token: str) -> UserInfo:
        key = hashlib.sha256(token.encode()).digest()
        result, cached = await self.cache.get_or_load(key, lambda: self._review(token),
                                                      lambda _v: self.ttl)
        self.metrics.token_cache.labels("hit" if cached else "miss").inc()
        if isinstance(result, str):
            raise AuthenticationFailed("token_invalid", result)
        return result

    async def _review(self, token: str) -> UserInfo | str:
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                "spec": {"token": token}}
        try:
            resp = await self.api.post(TOKENREVIEWS, body, timeout=self.timeout)
        except Exception as exc:
            self.metrics.tokenreview.labels("error").inc()
            log.warning("TokenReview failed: %s", exc)
            raise AuthenticationFailed("tokenreview_error", "token review failed") from exc
        status = resp.get("status") or {}
        u = status.get("user")
        if not status.get("authenticated") or not u:
            self.metrics.tokenreview.labels("unauthenticated").inc()
            return str(status.get("error") or "invalid bearer token")
        self.metrics.tokenreview.labels("authenticated").inc()
        return UserInfo(str(u.get("username") or ""), str(u.get("uid") or ""),
                        tuple(u.get("groups") or ()),
                        {k: tuple(v or ()) for k, v in (u.get("extra") or {}).items()})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str = ""


class AuthorizationError(Exception):
    """The authorizer could not decide (SAR failed): never an allow."""


def review_body(user: UserInfo, attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A SubjectAccessReview of ``user`` for ``attributes`` (the spec's
    ``resourceAttributes`` or ``nonResourceAttributes`` member)."""
    spec: dict[str, Any] = {
        "user": user.name,
        "groups": list(user.groups),
        "extra": {k: list(v) for k, v in user.extra.items()},
        **attributes,
    }
    if user.uid:
        spec["uid"] = user.uid
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": spec}


class AccessReviewer:
    """SubjectAccessReviews, cached per (user, attributes key), failing closed."""

    def __init__(self, api: KubeClient, metrics: ReviewMetrics, *, allow_ttl: float = 10.0,
                 deny_ttl: float = 10.0, maxsize: int = 10000, timeout: float = 5.0) -> None:
        self.api = api
        self.metrics = metrics
        self.allow_ttl = allow_ttl
        self.deny_ttl = deny_ttl
        self.timeout = timeout
        self.cache: TTLCache[Decision] = TTLCache(maxsize)

    async def decide(self, user: UserInfo, key: Hashable,
                     attributes: Mapping[str, Any]) -> Decision:
        """``key`` identifies ``attributes`` in the cache. Raises AuthorizationError
        when no decision could be had."""
        decision, cached = await self.cache.get_or_load(
            (user.key(), key), lambda: self._review(review_body(user, attributes)),
            lambda d: self.allow_ttl if d.allowed else self.deny_ttl)
        self.metrics.sar_cache.labels("hit" if cached else "miss").inc()
        return decision

    async def _review(self, body: dict[str, Any]) -> Decision:
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

    async def decide_path(self, user: UserInfo, verb: str, path: str) -> Decision:
        """The decision for a non-resource URL (``/metrics``, ``/healthz``...)."""
        return await self.decide(user, ("nonresource", verb, path),
                                 {"nonResourceAttributes": {"path": path, "verb": verb}})


def path_forbidden(user: UserInfo, verb: str, path: str, reason: str = "") -> StatusError:
    """The 403 kube-apiserver answers for a denied non-resource URL."""
    msg = f'forbidden: User "{user.name}" cannot {verb} path "{path}"'
    if reason:
        msg += f": {reason}"
    return StatusError(403, msg)


def bearer_token(request: web.Request) -> str:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


_PATH_VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update",
               "PATCH": "patch", "DELETE": "delete"}


def nonresource_guard(tokens: TokenReviewer, access: AccessReviewer) -> Middleware:
    """Every request needs a bearer token the TokenReview accepts (else 401) and a
    SubjectAccessReview allowing its verb on its path (else 403), as kube-rbac-proxy."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = bearer_token(request)
        if not token:
            raise StatusError(401, "Unauthorized: a bearer token is required")
        try:
            user = (await tokens.review(token)).with_authenticated()
        except AuthenticationFailed as exc:
            log.info("metrics authentication failed", extra={"reason": exc.reason})
            raise StatusError(401, "Unauthorized") from exc
        verb = _PATH_VERBS.get(request.method, request.method.lower())
        try:
            decision = await access.decide_path(user, verb, request.path)
        except AuthorizationError as exc:
            raise StatusError(503, "authorization is temporarily unavailable",
                              retry_after=1) from exc
        if not decision.allowed:
            raise path_forbidden(user, verb, request.path, decision.reason)
        return await handler(request)

    return guard
