"""Authorization by SubjectAccessReview, cached, failing closed.

Every resource request is checked with its real attributes (verb as
kube-apiserver derives it, group, version, resource, subresource, namespace,
name) and the caller's full identity. What each route needs is declared beside
it in the route table as an :class:`Authz` (discovery, OpenAPI and probes are
open, as kube-apiserver's aggregator fetches them as itself; pods/copy also needs
the operation's own verb and ``create`` on core ``pods/exec``), and
this layer makes every one of those decisions before the handler runs: handlers
do no authorization of their own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware

from aggapi.apiserver.requestinfo import INFO, RequestInfo
from aggapi.apiserver.user import USER, UserInfo
from aggapi.auth.delegated import (
    AccessReviewer,
    AuthorizationError,
    Decision,
    path_forbidden,
)
from aggapi.status import Handler, StatusError, forbidden

log = logging.getLogger(__name__)

# What an operation does -> the verb it needs whatever the path's verb was (a
# /watch/ path has verb watch for every method).
_OPERATION_VERBS = {"GET": "get", "HEAD": "get", "POST": "create"}


@dataclass(frozen=True)
class Also:
    """Another permission on the same object, e.g. ``create`` on core ``pods/exec``."""
    verb: str
    group: str
    version: str
    resource: str
    subresource: str
    methods: frozenset[str]  # the request methods that need it
    # A cluster-scoped resource (nodes/imagepulls): no namespace, and no name, so
    # the permission is on every object of the resource.
    cluster: bool = False

    def attributes(self, info: RequestInfo) -> RequestInfo:
        return dataclasses.replace(
            info, verb=self.verb, api_group=self.group, api_version=self.version,
            resource=self.resource, subresource=self.subresource,
            namespace="" if self.cluster else info.namespace,
            name="" if self.cluster else info.name)


@dataclass(frozen=True)
class Authz:
    """The authorization a route needs, declared beside it in the route table."""
    # The request's own attributes (verb from method and path, as kube-apiserver's).
    own: bool = True
    # Also the verb of the operation itself (get to read, create to write), so a
    # user who may only watch cannot write through the long-running /watch/ path.
    operation_verb: bool = False
    also: tuple[Also, ...] = ()
    # Asked, not required: what a handler shows depends on them (e.g. other
    # namespaces' pulls on the node). Decided by this layer when the handler first
    # needs one (request[PERMITS]), so requests that never need it cost no review.
    optional: tuple[Also, ...] = ()

    def attributes(self, info: RequestInfo, method: str) -> list[RequestInfo]:
        """Every set of attributes that must be allowed, in the order they are checked."""
        out = [info] if self.own else []
        if self.operation_verb:
            verb = _OPERATION_VERBS.get(method.upper(), info.verb)
            if verb != info.verb:
                out.append(dataclasses.replace(info, verb=verb))
        out.extend(a.attributes(info) for a in self.also if method.upper() in a.methods)
        return out


OPEN = Authz(own=False)
OWN = Authz()


def default_authz(info: RequestInfo) -> Authz:
    """For paths no route declares: resource requests and non-/apis paths are
    checked (then answer 404); other /apis paths are discovery, open."""
    return OWN if info.is_resource_request or not info.path.startswith("/apis") else OPEN


class Authorizer(AccessReviewer):
    """SubjectAccessReviews of a request's parsed attributes (resource or path)."""

    async def authorize(self, user: UserInfo, attrs: RequestInfo) -> Decision:
        """Raises AuthorizationError when no decision could be had."""
        return await self.decide(user, _attrs_key(attrs), sar_attributes(attrs))


def _attrs_key(a: RequestInfo) -> tuple[object, ...]:
    if a.is_resource_request:
        return (a.verb, a.api_group, a.api_version, a.resource, a.subresource,
                a.namespace, a.name)
    return ("nonresource", a.verb, a.path)


def sar_attributes(attrs: RequestInfo) -> dict[str, Any]:
    """The SubjectAccessReview spec's attributes member for ``attrs``."""
    if attrs.is_resource_request:
        return {"resourceAttributes": {
            "namespace": attrs.namespace, "verb": attrs.verb, "group": attrs.api_group,
            "version": attrs.api_version, "resource": attrs.resource,
            "subresource": attrs.subresource, "name": attrs.name}}
    return {"nonResourceAttributes": {"path": attrs.path, "verb": attrs.verb}}


async def check(authorizer: Authorizer, user: UserInfo, attrs: RequestInfo) -> None:
    """Raise the Status kube-apiserver would answer unless ``attrs`` is allowed."""
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
    raise path_forbidden(user, attrs.verb, attrs.path, decision.reason)


class Permits:
    """A request's optional permissions (``Authz.optional``), reviewed on demand."""

    def __init__(self, authorizer: Authorizer | None, user: UserInfo | None,
                 info: RequestInfo, method: str, optional: tuple[Also, ...]) -> None:
        self._authorizer, self._user, self._info = authorizer, user, info
        self._optional = tuple(o for o in optional if method.upper() in o.methods)
        self._decided: dict[Also, bool] = {}

    async def allows(self, perm: Also) -> bool:
        """Whether the caller has ``perm``; False for one the route did not declare,
        and when no decision could be had (fail closed)."""
        if perm not in self._optional or self._authorizer is None or self._user is None:
            return False
        if perm not in self._decided:
            try:
                decision = await self._authorizer.authorize(
                    self._user, perm.attributes(self._info))
            except AuthorizationError:
                return False  # not remembered: the next ask may get an answer
            self._decided[perm] = decision.allowed
        return self._decided[perm]


PERMITS: web.RequestKey[Permits] = web.RequestKey("permits", Permits)


def authz_middleware(authorizer: Authorizer,
                     authz_of: Callable[[web.Request], Authz]) -> Middleware:
    """Checks what the matched route declares (``authz_of``) for the request's one
    parsed :class:`RequestInfo`."""

    @web.middleware
    async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
        info = request[INFO]
        authz = authz_of(request)
        for attrs in authz.attributes(info, request.method):
            user = request.get(USER)
            if user is None:  # only unauthenticated paths lack a user: never allow
                raise StatusError(401, "Unauthorized")
            await check(authorizer, user, attrs)
        request[PERMITS] = Permits(authorizer, request.get(USER), info, request.method,
                                   authz.optional)
        return await handler(request)

    return authorize
