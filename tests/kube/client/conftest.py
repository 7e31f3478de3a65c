"""The HTTPS server the aggapi.kube.client tests talk to (its CA, client CA, routes),
and no in-cluster or KUBECONFIG environment leaking into them."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from aggapi.tls import pki

BIG = "x" * (300 << 10)  # one watch line far beyond aiohttp's readline buffer


@dataclass
class Certs:
    dir: Path
    ca: pki.KeyPair
    client_ca: pki.KeyPair

    def path(self, name: str) -> Path:
        return self.dir / name


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    c = Certs(tmp_path / "pki", pki.new_ca("kube-ca"), pki.new_ca("kube-client-ca"))
    c.ca.write(c.path("ca.crt"), c.path("ca.key"))
    pki.issue(c.ca, "kube-apiserver", ips=["127.0.0.1"], server=True).write(
        c.path("server.crt"), c.path("server.key"))
    pki.issue(c.client_ca, "alice", orgs=("devs",), client=True).write(
        c.path("alice.crt"), c.path("alice.key"))
    return c


@dataclass
class Api:
    """What the fake API server saw."""
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1]


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "reason": reason, "message": message, "code": code},
                             status=code)


def _app(api: Api) -> web.Application:
    async def record(request: web.Request) -> dict[str, Any]:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        cn = ""
        for rdn in (peer or {}).get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        seen = {"method": request.method, "path": request.path, "query": dict(request.query),
                "authorization": request.headers.get("Authorization", ""),
                "content_type": request.headers.get("Content-Type", ""),
                "client_cn": cn, "body": await request.text()}
        api.requests.append(seen)
        return seen

    async def echo(request: web.Request) -> web.Response:
        return web.json_response(await record(request))

    async def missing(request: web.Request) -> web.Response:
        await record(request)
        return _status(404, "NotFound", 'pods "missing" not found')

    async def broken(request: web.Request) -> web.Response:
        await record(request)
        return web.Response(status=502, text="<html>bad gateway</html>")

    async def pods(request: web.Request) -> web.StreamResponse:
        await record(request)
        if request.query.get("watch") != "true":
            return web.json_response({"kind": "PodList", "metadata": {"resourceVersion": "5"},
                                      "items": []})
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        events = [
            {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}},
            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
            {"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "8"},
                                            "data": BIG}},
            {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                         "message": "too old resource version"}},
        ]
        for i, ev in enumerate(events):
            line = json.dumps(ev).encode() + b"\n"
            if i == 2:  # split the big object across many writes
                for start in range(0, len(line), 7000):
                    await resp.write(line[start:start + 7000])
            else:
                await resp.write(line + (b"\n" if i == 0 else b""))  # blank lines are skipped
            await asyncio.sleep(0.01)
        return resp

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/api/v1/namespaces/ns/pods/missing", missing)
    app.router.add_get("/broken", broken)
    app.router.add_get("/api/v1/namespaces/ns/pods", pods)
    return app


ServeFn = Callable[..., Awaitable[Api]]


@pytest.fixture
async def serve(certs: Certs) -> AsyncIterator[ServeFn]:
    runners: list[web.AppRunner] = []

    async def start(*, client_cert_required: bool = False, tls: bool = True) -> Api:
        ctx = None
        if tls:
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(certs.path("server.crt"), certs.path("server.key"))
            if client_cert_required:
                ctx.verify_mode = ssl.CERT_REQUIRED
                ctx.load_verify_locations(cadata=certs.client_ca.cert_pem.decode())
        api = Api("")
        runner = web.AppRunner(_app(api), access_log=None, shutdown_timeout=0.1)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        api.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        return api

    yield start
    for r in runners:
        await r.cleanup()


@pytest.fixture(autouse=True)
def not_in_a_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
