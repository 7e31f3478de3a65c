"""Typed exceptions built from metav1.Status objects.

Every error the client raises is an :class:`AggapiError` carrying a Status dict:
the server's own when it sent one, or one synthesised here (for a non-Status
error body, a broken stream or a failed integrity check), so callers handle one
shape whatever went wrong.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class AggapiError(Exception):
    """Base of every client error; ``status`` is the metav1.Status dict."""

    code = 0
    reason = "Unknown"
    bodiless = False  # the reply had no body (a HEAD): the message is made up here

    def __init__(self, status: Mapping[str, Any], retry_after: float | None = None) -> None:
        self.status: dict[str, Any] = dict(status)
        self.message: str = str(self.status.get("message") or self.reason)
        self.retry_after = retry_after
        super().__init__(self.message)

    @classmethod
    def from_message(cls, message: str, **details: Any) -> AggapiError:
        status: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                  "status": "Failure", "message": message,
                                  "reason": cls.reason, "code": cls.code}
        if details:
            status["details"] = details
        return cls(status)

    def __str__(self) -> str:
        return self.message


class BadRequest(AggapiError):
    code, reason = 400, "BadRequest"


class Unauthorized(AggapiError):
    code, reason = 401, "Unauthorized"


class Forbidden(AggapiError):
    code, reason = 403, "Forbidden"


class NotFound(AggapiError):
    code, reason = 404, "NotFound"


class MethodNotAllowed(AggapiError):
    code, reason = 405, "MethodNotAllowed"


class Conflict(AggapiError):
    code, reason = 409, "Conflict"


class Gone(AggapiError):
    code, reason = 410, "Expired"


class TooLarge(AggapiError):
    code, reason = 413, "RequestEntityTooLarge"


class RangeNotSatisfiable(AggapiError):
    code, reason = 416, "RequestedRangeNotSatisfiable"


class Invalid(AggapiError):
    code, reason = 422, "Invalid"


class TooManyRequests(AggapiError):
    code, reason = 429, "TooManyRequests"


class InternalError(AggapiError):
    code, reason = 500, "InternalError"


class BadGateway(AggapiError):
    code, reason = 502, "BadGateway"


class ServiceUnavailable(AggapiError):
    code, reason = 503, "ServiceUnavailable"


class GatewayTimeout(AggapiError):
    code, reason = 504, "Timeout"


class InsufficientStorage(AggapiError):
    code, reason = 507, "InsufficientStorage"


# --- errors found on this side of the wire (code 0: no HTTP status) --------------------

class ClientError(AggapiError):
    reason = "ClientError"


class TransferError(ClientError):
    """A stream broke or ended short and could not be resumed."""

    reason = "TransferError"


class IntegrityError(ClientError):
    """Received bytes do not match the server's sha256."""

    reason = "IntegrityError"


class UnsafeArchive(ClientError):
    """A tar entry would write outside the destination, or is of a refused type."""

    reason = "UnsafeArchive"


class ConfigError(ClientError):
    """The kubeconfig, the in-cluster credentials or an exec credential plugin failed."""

    reason = "ConfigError"


class LocalError(ClientError):
    """The local side of a copy failed (missing source, existing destination, ...)."""

    reason = "LocalError"


BY_CODE: dict[int, type[AggapiError]] = {
    c.code: c for c in (BadRequest, Unauthorized, Forbidden, NotFound, MethodNotAllowed,
                        Conflict, Gone, TooLarge, RangeNotSatisfiable, Invalid,
                        TooManyRequests, InternalError, BadGateway, ServiceUnavailable,
                        GatewayTimeout, InsufficientStorage)
}

# Worth retrying after a pause: the server (or the aggregator in front of it) says so.
RETRYABLE = (TooManyRequests, ServiceUnavailable, BadGateway, GatewayTimeout)


def _retry_after(headers: Mapping[str, str], status: Mapping[str, Any]) -> float | None:
    raw = headers.get("Retry-After")
    if raw is not None:
        try:
            return max(0.0, float(raw))
        except ValueError:
            pass  # an HTTP date: rare from Kubernetes, fall back to the Status
    det = status.get("details")
    if isinstance(det, Mapping) and isinstance(det.get("retryAfterSeconds"), int | float):
        return float(det["retryAfterSeconds"])
    return None


def error_from_status(code: int, status: Mapping[str, Any],
                      headers: Mapping[str, str] | None = None) -> AggapiError:
    """The typed error for an HTTP code and a Status dict."""
    cls = BY_CODE.get(code)
    if cls is None:
        cls = InternalError if code >= 500 else BadRequest if code >= 400 else ClientError
    return cls(status, _retry_after(headers or {}, status))


def error_from_response(code: int, body: bytes, headers: Mapping[str, str] | None = None,
                        ) -> AggapiError:
    """Parse an error response; a body that is not a Status still yields a typed error."""
    status: dict[str, Any] | None = None
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and doc.get("kind") == "Status":
            status = doc
    except ValueError:
        pass
    if status is None:
        cls = BY_CODE.get(code)
        text = body.decode("utf-8", "replace").strip()[:2000] or f"HTTP {code}"
        status = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                  "message": text, "reason": cls.reason if cls else "Unknown", "code": code}
    err = error_from_status(code, status, headers)
    err.bodiless = not body.strip()
    return err
