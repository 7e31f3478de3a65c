"""Streaming response bodies: newline-delimited JSON, or Server-Sent Events.

Each object is written and flushed on its own, so `kubectl get --raw` prints it
as it happens (kube-apiserver's proxy flushes a body without Content-Length at
every write).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from aggapi.apiserver.imagepullprogress.fanout import Item

NDJSON = "application/json"
SSE = "text/event-stream"


def wants_sse(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return any(part.split(";")[0].strip() == SSE for part in accept.split(","))


class ObjectStream:
    """Write JSON objects to a streaming response, one per line or per SSE event."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.sse = wants_sse(request)
        self._resp = web.StreamResponse(status=200)
        self._resp.content_type = SSE if self.sse else NDJSON
        # Proxies (nginx, kube-apiserver in front of it) must not buffer a live stream.
        self._resp.headers["Cache-Control"] = "no-cache"
        self._resp.headers["X-Accel-Buffering"] = "no"
        self._seq = 0
        self.sent = 0

    @property
    def response(self) -> web.StreamResponse:
        return self._resp

    async def start(self) -> None:
        await self._resp.prepare(self._request)

    async def send(self, obj: Mapping[str, Any]) -> None:
        data = json.dumps(obj, separators=(",", ":"))
        if self.sse:
            self._seq += 1
            event = str(obj.get("kind") or "progress").lower()
            chunk = f"id: {self._seq}\nevent: {event}\ndata: {data}\n\n"
        else:
            chunk = data + "\n"
        await self._resp.write(chunk.encode())
        self.sent += 1

    async def send_items(self, items: Sequence[Item]) -> None:
        """Write already-encoded items in one write (one TLS record, not one per line)."""
        if self.sse:
            chunk = b"".join(
                f"id: {i.seq}\nevent: {str(i.obj.get('kind') or 'progress').lower()}\n"
                f"data: ".encode() + i.line[:-1] + b"\n\n" for i in items)
        else:
            chunk = b"".join(i.line for i in items)
        await self._resp.write(chunk)
        self.sent += len(items)

    async def finish(self) -> web.StreamResponse:
        await self._resp.write_eof()
        return self._resp
