"""The rig bench_copy, bench_progress and bench_upload_stream share: a fake kube-apiserver
(pod, EndpointSlice, allow-all SARs) in this process, a PKI, and ``python3 -m aggapi
apiserver`` as a process against it."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import aiohttp

from aggapi.auth.capability import CapabilitySigner
from aggapi.tls import certs as aggapi_certs
from aggapi.tls import pki
from tests.framework.procs import free_port

if TYPE_CHECKING:
    from tests.framework.fakekube import FakeKube


CHUNK = 1 << 20
NODE = "node-a"
AGENT_NS, AGENT_SVC = "aggapi", "aggapi-agent"
GV = "/apis/subresources.aggapi.io/v1alpha1"
FRONT_PROXY_CN = "front-proxy-client"
USER = "alice"
PROXY_TOKEN = "alice-token"



def pod_object(name: str, containers: list[tuple[str, str]], uid: str,
               namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"nodeName": NODE,
                     "containers": [{"name": n, "image": i} for n, i in containers]},
            "status": {}}


def endpoint_slice(port: int) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{AGENT_SVC}-x", "namespace": AGENT_NS,
                         "labels": {"kubernetes.io/service-name": AGENT_SVC}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": NODE,
                           "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}


@dataclass
class Pki:
    """aggapi's internal PKI (``aggapi certs``) + a cluster client CA + a front-proxy CA."""

    dir: Path
    client_ca: pki.KeyPair
    fp_ca: pki.KeyPair

    @classmethod
    def create(cls, where: Path) -> Pki:
        aggapi_certs.generate(where)
        p = cls(where, pki.new_ca("cluster-client-ca"), pki.new_ca("front-proxy-ca"))
        pki.issue(p.client_ca, USER, orgs=("devs",), client=True).write(
            where / "user.crt", where / "user.key")
        pki.issue(p.fp_ca, FRONT_PROXY_CN, client=True).write(
            where / "fp.crt", where / "fp.key")
        return p

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def user_ssl(self) -> ssl.SSLContext:
        """Trusts the apiserver's serving CA, presents the user's client certificate."""
        ctx = ssl.create_default_context(cafile=self.path("ca.crt"))
        ctx.load_cert_chain(self.path("user.crt"), self.path("user.key"))
        return ctx

    def agent_client_ssl(self) -> ssl.SSLContext:
        """What the apiserver presents to agents."""
        ctx = ssl.create_default_context(cafile=self.path("ca.crt"))
        ctx.load_cert_chain(self.path("agent-client.crt"), self.path("agent-client.key"))
        return ctx

    def auth_configmap(self) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "extension-apiserver-authentication",
                             "namespace": "kube-system"},
                "data": {
                    "client-ca-file": self.client_ca.cert_pem.decode(),
                    "requestheader-client-ca-file": self.fp_ca.cert_pem.decode(),
                    "requestheader-allowed-names": json.dumps([FRONT_PROXY_CN]),
                    "requestheader-username-headers": json.dumps(["X-Remote-User"]),
                    "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
                    "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"])}}


async def fake_pod(work: Path) -> tuple[Pki, Path, str, FakeKube, CapabilitySigner]:
    """A PKI, the pod "box" in the fake kube-apiserver with its container root (an empty
    directory), and the signer of its copy capabilities: (pki, root, pod uid, kube,
    signer)."""
    p = Pki.create(work / "pki")
    root = work / "root"
    root.mkdir()
    pod_uid = "0b5e7a2c-bench"
    kube = await start_fakekube(p)
    kube.put("api/v1", "pods", pod_object("box", [("app", "busybox")], pod_uid))
    signer = CapabilitySigner((work / "pki" / "token-signing.key").read_bytes())
    return p, root, pod_uid, kube, signer


async def start_fakekube(p: Pki) -> FakeKube:
    from tests.framework.fakekube import FakeKube

    kube = FakeKube()
    kube.sar_policy = lambda _spec: True
    kube.put("api/v1", "configmaps", p.auth_configmap())
    await kube.start()
    return kube


def write_kubeconfig(path: Path, server: str) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "bench"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "bench"}}]}))
    return str(path)


async def wait_ready(url: str, ctx: ssl.SSLContext, proc: asyncio.subprocess.Process,
                     within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: process exited with {proc.returncode}")
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except (aiohttp.ClientError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} not ready after {within} s")
            await asyncio.sleep(0.1)


async def stop_process(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def _open_log(path: Path) -> BinaryIO:
    return path.open("wb")


@asynccontextmanager
async def apiserver_process(p: Pki, kube: FakeKube, work: Path, *extra: str
                            ) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    """``python3 -m aggapi apiserver`` on 127.0.0.1 against ``kube``; yields (url, proc)."""
    port = free_port()
    kubeconfig = write_kubeconfig(work / "kubeconfig.json", kube.url)
    log = _open_log(work / "apiserver.log")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aggapi", "apiserver", "--bind-address=127.0.0.1",
        f"--secure-port={port}", f"--tls-cert-file={p.path('apiserver.crt')}",
        f"--tls-private-key-file={p.path('apiserver.key')}", f"--kubeconfig={kubeconfig}",
        f"--agent-namespace={AGENT_NS}", f"--agent-service={AGENT_SVC}",
        f"--agent-ca-file={p.path('ca.crt')}",
        f"--agent-client-cert-file={p.path('agent-client.crt')}",
        f"--agent-client-key-file={p.path('agent-client.key')}",
        f"--token-signing-key-file={p.path('token-signing.key')}",
        "--agent-pod-check=false",  # the benchmark's agent runs outside any pod
        "--log-level=warning", *extra, stdout=log, stderr=log)
    url = f"https://127.0.0.1:{port}"
    try:
        ctx = ssl.create_default_context(cafile=p.path("ca.crt"))
        await wait_ready(url + "/readyz", ctx, proc)
        yield url, proc
    finally:
        await stop_process(proc)
        log.close()
