"""Run the real agent app over HTTPS on 127.0.0.1 for tests, and call it as the
apiserver does (mTLS client cert + capability token)."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from aggapi import wire
from aggapi.agent.app import build_app, build_health_app, build_metrics_app, new_parts
from aggapi.agent.auth import SandboxLister, server_context, serving_context
from aggapi.agent.config import AgentConfig
from aggapi.agent.copy.state import Resolver
from aggapi.agent.main import listen
from aggapi.agent.progress.poller import Backend
from aggapi.auth.capability import CapabilitySigner, CapabilityVerifier, ContainerRef
from aggapi.kube.client import KubeClient
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from aggapi.tls import certs
from tests.agent.fakectd import FakeContainerd

NODE = "node-a"


def pki(where: Path) -> Path:
    certs.generate(where)
    return where


def client_ssl(pki_dir: Path, *, cert: bool = True, trust: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str((trust or pki_dir) / "ca.crt"))
    if cert:
        ctx.load_cert_chain(pki_dir / "agent-client.crt", pki_dir / "agent-client.key")
    return ctx


@dataclass
class Agent:
    url: str
    pki: Path
    signer: CapabilitySigner
    app: web.Application
    health_url: str = ""  # plain-HTTP probes
    metrics_url: str = ""  # HTTPS /metrics (server TLS only); "" without a metrics app

    def token(self, operation: str = "imagepullprogress", *, images: Sequence[str] = (),
              node: str = NODE, uid: str = "uid-1", **kw: Any) -> str:
        containers = [ContainerRef(f"c{i}", img) for i, img in enumerate(images)]
        return self.signer.sign(node=node, subject="alice", operation=operation,
                                pod_namespace="default", pod_name="p", pod_uid=uid,
                                containers=containers, **kw)

    @asynccontextmanager
    async def get(self, path: str, token: str | None, *, ssl_ctx: ssl.SSLContext | None = None,
                  params: Mapping[str, str] | None = None,
                  ) -> AsyncIterator[aiohttp.ClientResponse]:
        """GET ``path`` with query ``params``, as the apiserver (its client certificate
        unless ``ssl_ctx`` is given) with ``token`` as the bearer capability."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        async with aiohttp.ClientSession() as s, s.get(
                self.url + path, params=params, headers=headers,
                ssl=ssl_ctx or client_ssl(self.pki)) as resp:
            yield resp

    def session(self) -> aiohttp.ClientSession:
        """A session presenting the apiserver's client certificate (caller closes it)."""
        return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_ssl(self.pki)))

    @asynccontextmanager
    async def copy(self, method: str, path: str, *, uid: str, images: Sequence[str],
                   container: str = "c0", data: Any = None,
                   params: Mapping[str, str] | None = None,
                   headers: Mapping[str, str] | None = None,
                   session: aiohttp.ClientSession | None = None,
                   ) -> AsyncIterator[aiohttp.ClientResponse]:
        """One /v1/copy request (HEAD stat, GET download, POST upload) with a fresh
        capability for ``path``; upload ``params`` go in both the token and the query,
        as the apiserver sends them. Containers are c0, c1... as in :meth:`token`."""
        token = self.token(wire.copy_operation(method), images=images, uid=uid, path=path,
                           params=dict(params or {}))
        query = {"container": container, "path": path, **(params or {})}
        hdrs = {"Authorization": f"Bearer {token}", **(headers or {})}
        own = session is None
        s = session or self.session()
        try:
            async with s.request(method, self.url + "/v1/copy", params=query, data=data,
                                 headers=hdrs) as resp:
                yield resp
        finally:
            if own:
                await s.close()

    async def stream(self, token: str, **params: str) -> AsyncIterator[dict[str, Any]]:
        async with self.get("/v1/imagepullprogress", token, params=params) as resp:
            assert resp.status == 200, await resp.text()
            async for line in resp.content:
                yield json.loads(line)


@asynccontextmanager
async def run_agent(pki_dir: Path, *, cri: CRIClient | Any, containerd: ContainerdClient | Any,
                    backend: Backend | None = None, pod_check: SandboxLister | bool | None = True,
                    poll_interval: float = 0.25, kubelet_config: str = "/nonexistent",
                    snapshotter: str = "overlayfs", copy_resolver: Resolver | None = None,
                    kube: KubeClient | None = None, **overrides: Any) -> AsyncIterator[Agent]:
    """The agent's three apps: mTLS API, plain-HTTP probes and, with ``kube`` or
    ``metrics_auth="none"``, the metrics port."""
    config = AgentConfig(node_name=NODE, tls_cert=str(pki_dir / "agent.crt"),
                         tls_key=str(pki_dir / "agent.key"), client_ca=str(pki_dir / "ca.crt"),
                         token_public_key=str(pki_dir / "token-signing.pub"),
                         host="127.0.0.1", port=0, poll_interval=poll_interval,
                         platform="linux/amd64", kubelet_config=kubelet_config,
                         snapshotter=snapshotter, **overrides)
    verifier = CapabilityVerifier((pki_dir / "token-signing.pub").read_bytes(), NODE)
    parts = new_parts(config, cri=cri, containerd=containerd, verifier=verifier,
                      backend=backend, copy_resolver=copy_resolver, kube=kube)
    app = build_app(parts, pod_check=pod_check)
    runners = [await listen(app, config, 0, server_context(config.tls_cert, config.tls_key,
                                                           config.client_ca))]
    runners.append(await listen(build_health_app(parts), config, 0))
    if kube is not None or config.metrics_auth == "none":
        runners.append(await listen(build_metrics_app(parts), config, 0,
                                    serving_context(config.tls_cert, config.tls_key)))
    port, health = (r.addresses[0][1] for r in runners[:2])
    signer = CapabilitySigner((pki_dir / "token-signing.key").read_bytes())
    agent = Agent(f"https://127.0.0.1:{port}", pki_dir, signer, app,
                  health_url=f"http://127.0.0.1:{health}")
    if len(runners) > 2:
        agent.metrics_url = f"https://127.0.0.1:{runners[2].addresses[0][1]}"
    try:
        yield agent
    finally:
        for r in reversed(runners):
            await r.cleanup()


@asynccontextmanager
async def fake_runtime_agent(tmp_path: Path) -> AsyncIterator[Agent]:
    """An agent on a fake containerd whose clock is now, no CRI, no pod check, polling
    every 50 ms: for tests of what the agent does with a word or a token."""
    fake = FakeContainerd()
    fake.now = time.time()
    async with run_agent(pki(tmp_path / "pki"), cri=None, containerd=fake, pod_check=False,
                         poll_interval=0.05) as a:
        yield a
