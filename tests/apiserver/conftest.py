"""Fixtures: every certificate minted per test, a fake kube-apiserver, aggapi
apiserver on 127.0.0.1 over TLS, and an aggregator-like front proxy."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from aggapi.apiserver.app import new_app
from aggapi.apiserver.config import ApiServerConfig
from aggapi.apiserver.handlers.copy import CopyHandler
from aggapi.apiserver.imagepullprogress.handler import PodProgressHandler
from aggapi.apiserver.imagepullprogress.nodeview import NodePullsHandler
from aggapi.apiserver.parts import Parts, complete
from aggapi.apiserver.routes import Route
from aggapi.status import StatusError
from aggapi.tls import pki
from aggapi.tls.serving import ServingTLS
from tests.framework.fakekube import FakeKube
from tests.framework.frontproxy import FrontProxy, ProxyUser

GV = "/apis/subresources.aggapi.io/v1alpha1"
PROGRESS = GV + "/namespaces/ns1/pods/web-0/imagepullprogress"
WATCH_PROGRESS = GV + "/watch/namespaces/ns1/pods/web-0/imagepullprogress"
FRONT_PROXY_CN = "front-proxy-client"
H = TypeVar("H")


@dataclass
class Pki:
    dir: Path
    serving_ca: pki.KeyPair
    client_ca: pki.KeyPair
    front_proxy_ca: pki.KeyPair
    other_ca: pki.KeyPair

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def client_pair(self, ca: pki.KeyPair, cn: str, orgs: tuple[str, ...] = (),
                    name: str | None = None) -> tuple[str, str]:
        name = name or cn
        pair = pki.issue(ca, cn, orgs=orgs, client=True)
        pair.write(self.dir / f"{name}.crt", self.dir / f"{name}.key")
        return self.path(f"{name}.crt"), self.path(f"{name}.key")


@pytest.fixture
def certs(tmp_path: Path) -> Pki:
    p = Pki(tmp_path, pki.new_ca("serving-ca"), pki.new_ca("cluster-client-ca"),
            pki.new_ca("front-proxy-ca"), pki.new_ca("someone-else"))
    p.serving_ca.write(tmp_path / "serving-ca.crt", tmp_path / "serving-ca.key")
    pki.issue(p.serving_ca, "aggapi", dns=["localhost"], ips=["127.0.0.1"], server=True
              ).write(tmp_path / "tls.crt", tmp_path / "tls.key")
    return p


def auth_configmap(certs: Pki, *, allowed: list[str] | None = None,
                   rh_ca: pki.KeyPair | None = None) -> dict[str, Any]:
    """Shaped as kube-apiserver writes it: list values are JSON string arrays."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": {
            "client-ca-file": certs.client_ca.cert_pem.decode(),
            "requestheader-client-ca-file": (rh_ca or certs.front_proxy_ca).cert_pem.decode(),
            "requestheader-allowed-names": json.dumps(
                [FRONT_PROXY_CN] if allowed is None else allowed),
            "requestheader-username-headers": json.dumps(["X-Remote-User"]),
            "requestheader-uid-headers": json.dumps(["X-Remote-Uid"]),
            "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
            "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
        },
    }


@pytest.fixture
async def kube(certs: Pki) -> AsyncIterator[FakeKube]:
    fake = FakeKube()
    fake.put("api/v1", "configmaps", auth_configmap(certs))
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def lease_kube() -> AsyncIterator[FakeKube]:
    """A kube-apiserver with writable Leases only (the election's tests)."""
    fake = FakeKube()
    fake.writable.add("leases")
    await fake.start()
    yield fake
    await fake.stop()


@dataclass
class Server:
    url: str
    app: web.Application
    parts: Parts
    tls: ServingTLS
    certs: Pki
    kube: FakeKube
    runner: web.AppRunner
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)

    def session(self, cert: tuple[str, str] | None = None) -> aiohttp.ClientSession:
        """A client trusting the serving CA, optionally presenting ``cert``."""
        ctx = ssl.create_default_context(cafile=self.certs.path("serving-ca.crt"))
        if cert:
            ctx.load_cert_chain(*cert)
        s = aiohttp.ClientSession(self.url, connector=aiohttp.TCPConnector(ssl=ctx))
        self.sessions.append(s)
        return s

    def metric(self, name: str, **labels: str) -> float:
        return self.parts.metrics.value(name, **labels)

    def handler(self, kind: type[H]) -> H:
        """The app's handler object of class ``kind`` (to tune it in a test)."""
        return next(h for r in self.app.router.routes()
                    if isinstance(h := getattr(r.handler, "__self__", r.handler), kind))


async def _reached(_self: object, _request: web.Request) -> web.StreamResponse:
    raise StatusError(501, "reached the handler")


@pytest.fixture
async def make_server(certs: Pki, kube: FakeKube,
                      monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    runners: list[tuple[web.AppRunner, Server]] = []

    async def factory(wait_ready: bool = True,
                      setup: Callable[[Parts], list[Route]] | None = None,
                      stub_handlers: bool = True,
                      **overrides: Any) -> Server:
        if stub_handlers:
            # These tests are about what happens before a handler runs: a 501 from a
            # stub says authentication and authorization let the request through.
            for kind in (PodProgressHandler, NodePullsHandler, CopyHandler):
                monkeypatch.setattr(kind, "__call__", _reached)
        settings: dict[str, Any] = dict(
            bind_address="127.0.0.1", secure_port=0, tls_cert_file=certs.path("tls.crt"),
            tls_private_key_file=certs.path("tls.key"), tls_reload_interval=0.05,
            shutdown_grace=2.0, shutdown_final=1.0,
            # A leader's warm cluster-wide feed watches pods and events from the start:
            # only the tests of it (collections/test_warm.py) want those watches.
            collection_warm=False)
        cfg = ApiServerConfig(**{**settings, **overrides})
        tls = ServingTLS(cfg.tls_cert_file, cfg.tls_private_key_file,
                         poll_interval=cfg.tls_reload_interval)
        api = kube.kube_client()
        parts = complete(cfg, kube_api=api, tls=tls)
        app = new_app(parts, extra_routes=setup(parts) if setup is not None else None)
        app.on_cleanup.append(lambda _app: api.close())
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=cfg.shutdown_final,
                               handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls.context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        server = Server(f"https://127.0.0.1:{port}", app, parts, tls, certs, kube, runner)
        runners.append((runner, server))
        if wait_ready:
            await asyncio.wait_for(parts.auth_source.ready.wait(), 5)
        return server

    yield factory
    for runner, server in runners:
        for s in server.sessions:
            await s.close()
        await runner.cleanup()


@pytest.fixture
async def server(make_server: Any) -> Server:
    srv: Server = await make_server()
    return srv


ALICE = ProxyUser("alice", uid="u-1", groups=("devs",),
                  extra={"Scopes.Example.com/Team": ["a", "b"]})


@pytest.fixture
async def proxy(server: Server) -> AsyncIterator[FrontProxy]:
    cert, key = server.certs.client_pair(server.certs.front_proxy_ca, FRONT_PROXY_CN)
    fp = FrontProxy(server.url, client_cert=cert, client_key=key,
                    backend_ca=server.certs.path("serving-ca.crt"),
                    users={"alice-token": ALICE,
                           "aggregator-token": ProxyUser("system:kube-aggregator")})
    await fp.start()
    yield fp
    await fp.stop()
