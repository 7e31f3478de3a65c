"""metav1.Status errors, shared by the apiserver and the agent.

Handlers raise :class:`StatusError`; :func:`status_middleware` turns it, and any
stray aiohttp HTTP error or unexpected exception, into a ``kind: Status`` body
with the matching HTTP code, so clients (kubectl included) always get a Status.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

# HTTP code -> metav1.StatusReason, as k8s.io/apimachinery/pkg/api/errors uses them.
REASONS: dict[int, str] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    416: "RequestedRangeNotSatisfiable",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    501: "NotImplemented",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "Timeout",
    507: "InsufficientStorage",
}


class StatusError(Exception):
    """An error that is answered with a metav1.Status object."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: Mapping[str, Any] | None = None,
        retry_after: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or REASONS.get(code, "Unknown")
        self.details = dict(details) if details else None
        self.retry_after = retry_after
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.message, reason=self.reason, details=self.details,
                           retry_after=self.retry_after)

    def response(self) -> web.Response:
        headers = dict(self.headers)
        if self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        return web.Response(
            status=self.code,
            text=json.dumps(self.body()),
            content_type="application/json",
            headers=headers,
        )


def status_body(
    code: int,
    message: str,
    *,
    reason: str | None = None,
    details: Mapping[str, Any] | None = None,
    retry_after: int | None = None,
) -> dict[str, Any]:
    """A metav1.Status dict (``status: Failure`` for codes >= 400)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure" if code >= 400 else "Success",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    det = dict(details) if details else {}
    if retry_after is not None:
        det.setdefault("retryAfterSeconds", retry_after)
    if det:
        body["details"] = det
    return body


def not_found(kind: str, name: str, *, group: str = "") -> StatusError:
    return StatusError(
        404,
        f'{kind} "{name}" not found',
        details={"name": name, "group": group, "kind": kind},
    )


def forbidden(user: str, verb: str, resource: str, *, group: str, namespace: str = "",
              name: str = "", reason: str = "") -> StatusError:
    """The Forbidden message kube-apiserver writes, so users recognise it."""
    where = f' in the namespace "{namespace}"' if namespace else " at the cluster scope"
    msg = (f'{resource} "{name}" is forbidden: ' if name else f"{resource} is forbidden: ")
    msg += f'User "{user}" cannot {verb} resource "{resource}" in API group "{group}"{where}'
    if reason:
        msg += f": {reason}"
    return StatusError(403, msg, details={"name": name, "group": group, "kind": resource})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def status_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: every error leaves as a metav1.Status."""
    try:
        return await handler(request)
    except StatusError as err:
        return err.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return StatusError(exc.status, exc.text or exc.reason or "error",
                           headers={k: v for k, v in exc.headers.items()
                                    if k in ("Allow", "Retry-After", "WWW-Authenticate")}
                           ).response()
    except ConnectionResetError:
        # The client went away mid-stream; there is nobody to answer.
        raise
    except Exception:  # last resort: never leak a traceback to clients
        log.exception("internal error handling %s %s", request.method, request.path)
        return StatusError(500, "internal error").response()
