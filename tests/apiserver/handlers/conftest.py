"""The apiserver wired to a real agent on real containerd, behind the fake
kube-apiserver and the aggregator-like front proxy.

Kubernetes objects (pods, events, the agent's EndpointSlice) live in the fake;
pulls and containers are real and driven through CRI, as kubelet would.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from aggapi.tls import certs as aggapi_certs
from tests.agent.agentserver import NODE, Agent, run_agent
from tests.framework.fakekube import FakeKube
from tests.framework.frontproxy import FrontProxy
from tests.kubeobjects import pod_object as pod_object  # re-exported to the handler tests

from ..conftest import ALICE, FRONT_PROXY_CN, GV, Server

AGENT_NS, AGENT_SVC = "aggapi", "aggapi-agent"
USER = {"Authorization": "Bearer alice-token"}




async def serve_standin_agent(app: web.Application, pki_dir: Path) -> tuple[web.AppRunner, int]:
    """``app`` served over TLS with the agent's certificate from ``pki_dir``
    (aggapi.tls.certs.generate) on 127.0.0.1: a stand-in agent the relay trusts.
    The runner (the caller cleans it up) and the port."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(pki_dir / "agent.crt", pki_dir / "agent.key")
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    server = site._server
    assert server is not None and server.sockets  # type: ignore[attr-defined]
    return runner, int(server.sockets[0].getsockname()[1])  # type: ignore[attr-defined]


async def relay_to_standin(make_server: Any, kube: FakeKube, pki_dir: Path,
                           port: int, **config: Any) -> Server:
    """The apiserver relaying to the stand-in agent on ``port`` (serve_standin_agent),
    for a pod ``default/box``, every request allowed."""
    kube.put("apis/discovery.k8s.io/v1", "endpointslices", endpoint_slice(port))
    kube.put("api/v1", "pods", pod_object("box", [("app", "busybox")]))
    kube.sar_policy = lambda _spec: True
    server: Server = await make_server(
        stub_handlers=False, agent_namespace=AGENT_NS, agent_service=AGENT_SVC,
        agent_ca_file=str(pki_dir / "ca.crt"),
        agent_client_cert_file=str(pki_dir / "agent-client.crt"),
        agent_client_key_file=str(pki_dir / "agent-client.key"),
        token_signing_key_file=str(pki_dir / "token-signing.key"),
        agent_pod_check=False,  # the stand-in runs in this process, not in a pod
        **config)
    return server


async def raw_upload(srv: Server, total: int
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw client of the relay that has sent the head of a ``total``-byte upload to
    ``box``'s /tmp/x and goes on sending whatever is answered, as kube-apiserver's
    aggregator does (it relays the user's body as it comes): the caller sends the body."""
    cert, key = srv.certs.client_pair(srv.certs.client_ca, "carol")
    ctx = ssl.create_default_context(cafile=srv.certs.path("serving-ca.crt"))
    ctx.load_cert_chain(cert, key)
    host, _, srv_port = srv.url.rpartition("//")[2].partition(":")
    reader, writer = await asyncio.open_connection(host, int(srv_port), ssl=ctx,
                                                   server_hostname=host)
    writer.write((f"POST {GV}/namespaces/default/pods/box/copy?container=app&path=/tmp/x"
                  f" HTTP/1.1\r\nHost: {host}\r\nContent-Length: {total}\r\n"
                  "Content-Type: application/octet-stream\r\n\r\n").encode())
    return reader, writer


async def read_answer(reader: asyncio.StreamReader
                      ) -> tuple[bytes, float, dict[str, str], dict[str, Any]]:
    """The relay's answer: (status line, when it arrived, headers, JSON body)."""
    status_line = await reader.readline()
    answered = time.monotonic()
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    headers = dict(h.split(": ", 1) for h in head.split("\r\n") if ": " in h)
    body = json.loads(await reader.readexactly(int(headers["Content-Length"])))
    return status_line, answered, headers, body


def endpoint_slice(port: int, *, node: str = NODE, ready: bool = True) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{AGENT_SVC}-x", "namespace": AGENT_NS,
                         "labels": {"kubernetes.io/service-name": AGENT_SVC}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": node,
                           "conditions": {"ready": ready}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}


@dataclass
class Stack:
    server: Server
    proxy: FrontProxy
    kube: FakeKube
    agent: Agent
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)

    def pod_path(self, pod: str, sub: str, *, ns: str = "default", watch: bool = False) -> str:
        return f"{GV}{'/watch' if watch else ''}/namespaces/{ns}/pods/{pod}/{sub}"

    def session(self) -> aiohttp.ClientSession:
        s = aiohttp.ClientSession(self.proxy.url, headers=USER,
                                  timeout=aiohttp.ClientTimeout(total=300))
        self.sessions.append(s)
        return s

    async def lines(self, path: str, **params: Any) -> tuple[int, list[dict[str, Any]]]:
        """GET a stream to its end; (status, objects)."""
        async with self.session().get(path, params=params) as resp:
            if resp.status != 200:
                return resp.status, [await resp.json(content_type=None)]
            return 200, [json.loads(line) async for line in resp.content if line.strip()]

    def add_event(self, pod: dict[str, Any], reason: str, container: str, message: str,
                  t: str, kind: str = "containers") -> None:
        meta = pod["metadata"]
        self.kube.put("api/v1", "events", {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:8]}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               "fieldPath": f"spec.{kind}{{{container}}}"},
            "reason": reason, "message": message, "lastTimestamp": t, "type": "Normal",
            # As kubelet reports: only its events from the pod's node count.
            "source": {"component": "kubelet",
                       "host": (pod.get("spec") or {}).get("nodeName", "")}})


@pytest.fixture
async def stack(tmp_path: Path, make_server: Any, kube: FakeKube, cri: CRIClient,
                ctd: ContainerdClient) -> AsyncIterator[Stack]:
    agent_pki = tmp_path / "agent-pki"
    aggapi_certs.generate(agent_pki)
    async with run_agent(agent_pki, cri=cri, containerd=ctd,
                         copy=CopyLimits(state_dir=str(tmp_path / "inflight"),
                                         size_limit=2 << 30, copies_per_pod=2)) as agent:
        port = int(agent.url.rsplit(":", 1)[1])
        kube.put("apis/discovery.k8s.io/v1", "endpointslices", endpoint_slice(port))
        kube.sar_policy = lambda _spec: True
        server: Server = await make_server(
            stub_handlers=False, stream_deadline=55.0,
            agent_namespace=AGENT_NS, agent_service=AGENT_SVC,
            agent_pod_check=False,  # the agent runs in this process, not in a pod
            agent_ca_file=str(agent_pki / "ca.crt"),
            agent_client_cert_file=str(agent_pki / "agent-client.crt"),
            agent_client_key_file=str(agent_pki / "agent-client.key"),
            token_signing_key_file=str(agent_pki / "token-signing.key"))
        cert, key = server.certs.client_pair(server.certs.front_proxy_ca, FRONT_PROXY_CN)
        proxy = FrontProxy(server.url, client_cert=cert, client_key=key,
                           backend_ca=server.certs.path("serving-ca.crt"),
                           users={"alice-token": ALICE})
        await proxy.start()
        st = Stack(server, proxy, kube, agent)
        try:
            yield st
        finally:
            for s in st.sessions:
                await s.close()
            await proxy.stop()
