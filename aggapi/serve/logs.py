"""Structured logs: one JSON object per line, carrying the request's Audit-ID.

Shared by the apiserver and the agent. ``configure()`` once at start-up;
``audit_id_middleware`` binds the request's ``Audit-ID`` header (or a fresh one)
to a context variable so every log line written while serving it carries it.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import IO, Any

from aiohttp import web

AUDIT_HEADER = "Audit-ID"
audit_id: contextvars.ContextVar[str] = contextvars.ContextVar("audit_id", default="")

# LogRecord attributes that are not user extras.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        aid = audit_id.get()
        if aid:
            out["auditID"] = aid
        # Extras passed with logger.info(..., extra={...}) become fields.
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str | int = "info", stream: IO[str] | None = None) -> None:
    """Route the root logger to ``stream`` (stderr) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # aiohttp's access log duplicates our request log line.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def audit_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Bind the Audit-ID for this request's logs and echo it in the response."""
    aid = request.headers.get(AUDIT_HEADER) or str(uuid.uuid4())
    token = audit_id.set(aid)
    try:
        resp = await handler(request)
        if not resp.prepared:
            resp.headers[AUDIT_HEADER] = aid
        return resp
    finally:
        audit_id.reset(token)
