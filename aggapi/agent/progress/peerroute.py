"""PUT /v1/linkpeers: the apiserver's leader tells this node the other nodes' pulls on
its link (aggapi.agent.progress.peers). Authenticated as every apiserver call (client
certificate, capability token for this node and operation ``linkpeers``: the auth
middleware); the body is bounded and checked whole before anything is kept."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.poller import ProgressPoller
from aggapi.linkpeers import BadPeers, PeerLink, parse
from aggapi.status import StatusError

MAX_BODY = 256 * 1024  # 64 peers x 32 pulls fit several times over


async def _body(request: web.Request) -> bytes:
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise StatusError(413, f"the body is larger than {MAX_BODY} bytes")
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.read(64 * 1024):
        size += len(chunk)
        if size > MAX_BODY:
            raise StatusError(413, f"the body is larger than {MAX_BODY} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(raw: bytes) -> PeerLink:
    try:
        return parse(json.loads(raw))
    except (ValueError, RecursionError) as exc:  # BadPeers and JSON errors alike
        raise BadPeers(str(exc) if isinstance(exc, BadPeers) else "not JSON") from None


class PeerRoute:
    def __init__(self, poller: ProgressPoller) -> None:
        self.poller = poller

    async def put(self, request: web.Request) -> web.Response:
        raw = await _body(request)
        try:
            peers = await asyncio.to_thread(_parse, raw)  # off the event loop
        except BadPeers as exc:
            raise StatusError(400, f"invalid link peers: {exc}") from None
        backend = self.poller.backend
        if isinstance(backend, ContainerdBackend):  # CRI-only nodes plan no link
            backend.tell_peers(peers)
        return web.Response(status=204)
