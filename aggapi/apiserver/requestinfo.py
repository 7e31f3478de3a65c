"""Request attributes derived from method and path as kube-apiserver's RequestInfoFactory does.

The verb matters twice: it is what SubjectAccessReview checks, and kube-apiserver
treats verb ``watch`` (the ``/apis/G/V/watch/...`` prefix, any method) as
long-running, so the aggregator does not cut it at --request-timeout.

This is the one parse of the request path: authorization checks the
``RequestInfo`` made here and the handlers act on the very same object (never on
``match_info``). aiohttp routes on the raw path, so a segment like
``web-0%2Fimagepullprogress`` would be one segment to the router and two to a
parse of the decoded path; the parse therefore splits the raw path and refuses,
with 400 before any authentication, every segment that could mean different
things to different readers: an encoded ``/``, a NUL, a dot segment, or an
empty one (``//``, which some normalizers collapse).

The field selector is parsed here too, once (``fieldselector.py``): a list or watch
of one ``metadata.name`` is authorized for that name, as kube-apiserver does, and
the collections filter with the very same terms.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web

from aggapi.apiserver import fieldselector
from aggapi.apiserver.fieldselector import FieldTerm
from aggapi.status import Handler, StatusError

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
    # The parsed fieldSelector of a read (get, list, watch) of a resource itself.
    fields: tuple[FieldTerm, ...] = ()


def flag(value: str | None) -> bool:
    """A boolean query parameter as kube-apiserver converts it: absent, "0" and
    "false" (any case) are false; anything else, "" included, is true."""
    return value is not None and value != "0" and value.lower() != "false"


def _segment(raw: str) -> str:
    seg = urllib.parse.unquote(raw, errors="strict")
    if "/" in seg or "\x00" in seg or seg in ("", ".", ".."):
        raise StatusError(400, f"invalid path segment {raw!r}: empty and dot segments, "
                               "encoded '/' and NUL are not allowed")
    return seg


def _exact_name(fields: tuple[FieldTerm, ...]) -> str:
    """The name a selector requires, when it is one a path could name (kube-apiserver's
    IsValidPathSegmentName); otherwise "" (authorized for every name)."""
    name = fieldselector.exact_match(fields, "metadata.name") or ""
    return "" if name in (".", "..") or "/" in name or "%" in name else name


def split_path(raw_path: str) -> list[str]:
    """The decoded segments of a raw (still percent-encoded) path; 400 for a bad one."""
    try:
        return [_segment(raw) for raw in raw_path.strip("/").split("/")] \
            if raw_path.strip("/") else []
    except UnicodeDecodeError:
        raise StatusError(400, "invalid path: percent-encoding is not UTF-8") from None


def parse(method: str, raw_path: str, query: Mapping[str, str] | None = None) -> RequestInfo:
    """Attributes of a request for ``raw_path`` (its query and fragment cut off first)."""
    raw_path = urllib.parse.urlsplit(raw_path).path if "://" in raw_path.split("?")[0] \
        else raw_path.split("?", 1)[0].split("#", 1)[0]
    query = query or {}
    method = method.upper()
    all_parts = split_path(raw_path)
    path = urllib.parse.unquote(raw_path)
    non_resource = RequestInfo(verb=method.lower(), path=path)
    if not all_parts or all_parts[0] not in _API_PREFIXES:
        return non_resource
    parts = all_parts[1:]
    group = ""
    if all_parts[0] == "apis":
        if len(parts) < 3:  # /apis, /apis/G, /apis/G/V: discovery
            return non_resource
        group, parts = parts[0], parts[1:]
    elif len(parts) < 2:  # /api, /api/v1
        return non_resource
    version, parts = parts[0], parts[1:]

    verb = ""
    if parts and parts[0] == "watch":
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

    fields: tuple[FieldTerm, ...] = ()
    if verb in ("get", "watch") and not subresource:
        fields = fieldselector.parse(query.get("fieldSelector") or "")
    if not name and verb in ("get", "watch"):
        if verb == "get":
            verb = "watch" if flag(query.get("watch")) else "list"
        # As kube-apiserver: a list or watch of one name (metadata.name=N) is
        # authorized for that name (RBAC resourceNames apply).
        name = _exact_name(fields)
    elif not name and verb == "delete":
        verb = "deletecollection"
    elif verb == "get" and not subresource and flag(query.get("watch")):
        # A named object's ?watch=true is served as a watch (the collections do), so
        # it is authorized as one. (kube-apiserver serves it as a get.)
        verb = "watch"
    return RequestInfo(verb=verb, api_group=group, api_version=version, namespace=namespace,
                       resource=resource, subresource=subresource, name=name,
                       is_resource_request=True, path=path, fields=fields)


# Set by the request-info middleware; what authorization checks and handlers act on.
INFO: web.RequestKey[RequestInfo] = web.RequestKey("info", RequestInfo)


@web.middleware
async def requestinfo_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    # raw_path, not path: see the module docstring.
    request[INFO] = parse(request.method, request.raw_path, request.query)
    return await handler(request)
