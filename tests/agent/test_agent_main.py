"""`aggapi agent` as a whole (aggapi.agent.main.serve): the three listeners on their
ports, a CRI socket that does not exist making /readyz fail, and the metrics port
checking scrapers through the kubeconfig's API server (FakeKube)."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import aiohttp
import pytest

from aggapi.agent.config import from_args
from aggapi.agent.main import serve
from aggapi.auth import agentidentity as ai
from aggapi.auth.capability import CapabilitySigner
from aggapi.auth.tokenkeys import KeyPublisher
from tests.agent.agentserver import client_ssl, pki
from tests.framework.fakekube import FakeKube


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def wait_up(url: str, ctx: ssl.SSLContext | bool) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(url, ssl=ctx):
                    return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


async def test_serve_probes_and_delegated_metrics(tmp_path: Path) -> None:
    certs = pki(tmp_path / "pki")
    kube = FakeKube()
    url = await kube.start()
    kube.tokens = {"prom": {"username": "prometheus"}}
    kube.sar_policy = lambda spec: spec["user"] == "prometheus"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    health, metrics, api = free_port(), free_port(), free_port()
    config = from_args([
        "--node-name", "n1", "--certs-dir", str(certs), "--bind-address", "127.0.0.1",
        "--secure-port", str(api), "--health-port", str(health),
        "--metrics-port", str(metrics), "--kubeconfig", str(kubeconfig),
        "--runtime", "cri", "--cri-address", str(tmp_path / "no-such.sock")])
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop))
    scraper = ssl.create_default_context(cafile=str(certs / "ca.crt"))
    try:
        await wait_up(f"http://127.0.0.1:{health}/livez", False)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{health}/readyz?verbose") as r:
                body = await r.text()
                assert r.status == 500, body
                assert body.splitlines()[0].startswith("[-]cri failed: ")
            base = f"https://127.0.0.1:{metrics}/metrics"
            async with s.get(base, ssl=scraper) as r:
                assert r.status == 401
            async with s.get(base, ssl=scraper, headers={"Authorization": "Bearer prom"}) as r:
                assert r.status == 200
                assert "aggapi_agent_requests_total" in await r.text()
        assert kube.token_calls == ["prom"]
    finally:
        stop.set()
        await task
        await kube.stop()


def _kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: '{url}'}}}}]\n"
        "users: [{name: u, user: {}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n")
    return path


async def test_agent_follows_the_published_keys(tmp_path: Path) -> None:
    """--token-key-set: no key file; tokens of a replica verify once its ConfigMap is
    published, and no longer once it was replaced (the replica restarted)."""
    certs = pki(tmp_path / "pki")
    kube = FakeKube()
    kube.writable = {"configmaps"}
    url = await kube.start()
    api, health = free_port(), free_port()
    config = from_args([
        "--node-name", "n1", "--certs-dir", str(certs), "--bind-address", "127.0.0.1",
        "--secure-port", str(api), "--health-port", str(health),
        "--kubeconfig", str(_kubeconfig(tmp_path / "kubeconfig", url)),
        "--token-key-set", "aggapi", "--token-key-namespace", "aggapi",
        "--runtime", "cri", "--cri-address", str(tmp_path / "no-such.sock")])
    assert config.token_public_key == ""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop))
    mtls = client_ssl(certs)
    old, new = CapabilitySigner.generate(), CapabilitySigner.generate()

    async def publish(signer: CapabilitySigner) -> None:
        await KeyPublisher(kube.kube_client(), signer, namespace="aggapi", pod_name="api-0",
                           pod_uid="u0", key_set="aggapi").publish_once()

    async def call(s: aiohttp.ClientSession, signer: CapabilitySigner) -> int:
        token = signer.sign(node="n1", subject="a", operation="imagepulls")
        async with s.get(f"https://127.0.0.1:{api}/v1/imagepulls", ssl=mtls,
                         server_hostname="aggapi-agent",
                         headers={"Authorization": f"Bearer {token}"}) as r:
            return r.status

    try:
        await wait_up(f"http://127.0.0.1:{health}/livez", False)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{health}/readyz?verbose") as r:
                assert "[+]token-keys ok" in await r.text()
            assert await call(s, old) == 401  # not published (waited 3 s for it)
            await publish(old)
            assert await call(s, old) not in (401, 403)
            await publish(new)  # the replica restarted: a new key in its ConfigMap
            assert await call(s, new) not in (401, 403)
            assert await call(s, old) == 401
    finally:
        stop.set()
        await task
        await kube.stop()


async def test_agent_serves_the_identity_it_published(tmp_path: Path) -> None:
    """--identity-key-set: no serving key file; the certificate the agent serves is the
    one in its CSR, and a client trusting only that certificate gets through."""
    certs = pki(tmp_path / "pki")
    kube = FakeKube()
    kube.writable = {"certificatesigningrequests"}
    url = await kube.start()
    api, health = free_port(), free_port()
    config = from_args([
        "--node-name", "n1", "--client-ca-file", str(certs / "ca.crt"),
        "--token-public-key-file", str(certs / "token-signing.pub"),
        "--bind-address", "127.0.0.1", "--secure-port", str(api),
        "--health-port", str(health), "--identity-key-set", "aggapi",
        "--kubeconfig", str(_kubeconfig(tmp_path / "kubeconfig", url)),
        "--runtime", "cri", "--cri-address", str(tmp_path / "no-such.sock")])
    assert config.tls_cert == config.tls_key == ""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(config, stop))
    try:
        await wait_up(f"http://127.0.0.1:{health}/livez", False)
        csrs = kube.objects.get(("apis/certificates.k8s.io/v1", "certificatesigningrequests"))
        while not csrs:
            await asyncio.sleep(0.05)
            csrs = kube.objects.get(("apis/certificates.k8s.io/v1",
                                     "certificatesigningrequests"))
        (csr,) = csrs.values()
        csr["spec"].update(username="system:serviceaccount:aggapi:aggapi-agent",
                           extra={ai.POD_UID: ["u1"], ai.NODE_NAME: ["n1"]})
        got = ai.pin_of(csr, username="system:serviceaccount:aggapi:aggapi-agent")
        assert not isinstance(got, str), got
        pinned = ssl.create_default_context(cadata=got[1].cert_pem.decode())
        pinned.load_cert_chain(certs / "agent-client.crt", certs / "agent-client.key")
        async with aiohttp.ClientSession() as s:
            async with s.get(f"https://127.0.0.1:{api}/livez", ssl=pinned,
                             server_hostname="aggapi-agent") as r:
                assert r.status == 200
            # The shared agent certificate's CA does not vouch for it any more.
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                async with s.get(f"https://127.0.0.1:{api}/livez", ssl=client_ssl(certs),
                                 server_hostname="aggapi-agent"):
                    pass
            async with s.get(f"http://127.0.0.1:{health}/readyz?verbose") as r:
                assert "[+]identity ok" in await r.text()
    finally:
        stop.set()
        await task
        await kube.stop()
