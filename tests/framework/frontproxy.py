"""An aggregator-like front proxy for tests.

Like kube-apiserver's aggregation layer: authenticates its caller (a static
bearer-token table), strips credentials and identity headers, then forwards path,
query and body unchanged over TLS with the front-proxy client certificate and
X-Remote-* headers carrying the caller's identity. Bodies stream both ways.
"""

from __future__ import annotations

import ssl
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

# Hop-by-hop headers are not forwarded; Content-Length is (as Go's ReverseProxy in
# kube-apiserver does), so sizes and HEAD replies survive the proxy.
_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailers", "transfer-encoding", "upgrade", "host"}


@dataclass(frozen=True)
class ProxyUser:
    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)


class FrontProxy:
    def __init__(self, backend: str, *, client_cert: str, client_key: str, backend_ca: str,
                 users: Mapping[str, ProxyUser], user_header: str = "X-Remote-User",
                 uid_header: str = "X-Remote-Uid", group_header: str = "X-Remote-Group",
                 extra_prefix: str = "X-Remote-Extra-") -> None:
        self.backend = backend.rstrip("/")
        self.users = dict(users)
        self.headers = (user_header, uid_header, group_header, extra_prefix)
        self.ssl = ssl.create_default_context(cafile=backend_ca)
        self.ssl.load_cert_chain(client_cert, client_key)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1") -> str:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self.ssl, limit=0),
            timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        # Like kube-apiserver's proxy, a client that leaves cancels the backend request.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5,
                                     handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, 0)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def identity_headers(self, user: ProxyUser) -> list[tuple[str, str]]:
        uh, idh, gh, xp = self.headers
        out = [(uh, user.name)]
        if user.uid:
            out.append((idh, user.uid))
        out += [(gh, g) for g in user.groups]
        for key, values in user.extra.items():
            out += [(xp + urllib.parse.quote(key, safe=""), v) for v in values]
        return out

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        user = self.users.get(auth.removeprefix("Bearer ").strip()) if auth else None
        if user is None:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 401,
                                      "status": "Failure", "reason": "Unauthorized",
                                      "message": "Unauthorized"}, status=401)
        xp = self.headers[3].lower()
        headers = [(k, v) for k, v in request.headers.items()
                   if k.lower() not in _HOP and k.lower() != "authorization"
                   and not k.lower().startswith(("impersonate-", "x-remote-", xp))]
        headers += self.identity_headers(user)
        assert self._session is not None
        body = request.content if request.can_read_body else None
        async with self._session.request(
                request.method, self.backend + request.path_qs, headers=headers,
                data=body, allow_redirects=False) as upstream:
            resp = web.StreamResponse(status=upstream.status, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in _HOP})
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
