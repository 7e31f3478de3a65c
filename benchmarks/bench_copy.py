"""Copy throughput and memory (issue 5): 1 GiB upload and download, side by side,

  baseline   a raw TLS loopback server that only discards / produces bytes
  agent      the real agent app (aggapi.agent.app.build_app: mTLS + capability token)
             called directly, as the apiserver calls it
  apiserver  ``python3 -m aggapi apiserver`` in front of that agent, client-cert auth
             (a user certificate of the ConfigMap's client CA), TLS end to end
  proxy      the aggregator stand-in (tests.framework.frontproxy) in front of the
             apiserver: plain HTTP client -> proxy, TLS + front-proxy cert -> apiserver
  ncp        (--ncp) the ncp plugin (``python3 -m aggapi.plugins.ncp``, a process per
             transfer, its CPU from rusage) straight at the apiserver, a file on disk
             both ways: the client's own CPU per GiB, without a kube-apiserver

Every server is its own process (peak RSS = its VmHWM); the client (aiohttp, 1 MiB
chunks) is the same for all legs. The agent's "container" is a temp directory (a
resolver returning its dirfd, no CRI), so the figures are the copy path, not overlayfs.
The fake kube-apiserver (pod, EndpointSlice, allow-all SARs) runs in this process.

``BENCH_NCP_PYSPY=DIR`` runs the ncp client under py-spy (its CPU figures then include
py-spy's). ``BENCH_PYSPY=DIR`` attaches py-spy (raw, native) to the agent and the apiserver
during each agent and apiserver transfer: DIR/<leg>-<direction>-<process>.txt, for
``python3 -m benchmarks.pyspy_top``. Legs run interleaved, ``--rounds`` times (default 2);
each reports its best round, as the CPUs are shared. Run: ``python3 -m
benchmarks.bench_copy [--size-mib 1024] [--rounds 2] [--no-proxy]`` (root: the handlers
chown).
Goals: through the apiserver >= 0.5x the baseline; every process's peak RSS < 100 MB;
(issue 15) the agent at most 2.2 CPU-s/GiB uploading and 1.6 downloading, the apiserver's
relay no worse than when the issue was filed (2.7 CPU-s/GiB, its figure for cd58391; an
earlier 1.5 came from another machine, where 9b02952 measured 1.18 up and 1.40 down:
re-measured on this machine kind on 2026-11-26, 9b02952 gave 2.37 and 2.37).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import aiohttp
from aiohttp import web

from aggapi import eventloop
from aggapi.auth.capability import CapabilitySigner, ContainerRef
from aggapi.serve import site as serving
from aggapi.tls import certs as aggapi_certs
from aggapi.tls import pki
from benchmarks._procstats import cpu_seconds, peak_rss_mib, rss_mib
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


# --- shared with bench_progress: fake kube-apiserver + `aggapi apiserver` process ------

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


async def _proxy_main(backend: str, cert: str, key: str, ca: str) -> None:
    from tests.framework.frontproxy import FrontProxy, ProxyUser

    proxy = FrontProxy(backend, client_cert=cert, client_key=key, backend_ca=ca,
                       users={PROXY_TOKEN: ProxyUser(USER, groups=("devs",))})
    _announce(await proxy.start())
    await asyncio.Event().wait()


@asynccontextmanager
async def front_proxy_process(p: Pki, backend: str) -> AsyncIterator[tuple[str, int]]:
    """The aggregator stand-in in its own process; yields (url, pid)."""
    async with child("proxy", backend, p.path("fp.crt"), p.path("fp.key"),
                     p.path("ca.crt")) as (url, pid):
        yield url, pid


# --- servers in child processes ----------------------------------------------------

async def _sink(request: web.Request) -> web.Response:
    n = 0
    while data := await request.content.read(CHUNK):
        n += len(data)
    return web.json_response({"size": n})


async def _source(request: web.Request) -> web.StreamResponse:
    size = int(request.query["size"])
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = size
    await resp.prepare(request)
    block = b"\0" * CHUNK
    left = size
    while left:
        await resp.write(block[:min(left, CHUNK)])
        left -= min(left, CHUNK)
    return resp


async def _baseline_main(cert: str, key: str) -> None:
    app = web.Application(client_max_size=1 << 40)
    app.router.add_post("/sink", _sink)
    app.router.add_get("/source", _source)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    _announce(f"https://127.0.0.1:{runner.addresses[0][1]}")
    await asyncio.Event().wait()


class _DirResolver:
    """The pod's container root is a plain directory."""

    def __init__(self, root: str, pod_uid: str) -> None:
        self.root, self.pod_uid = root, pod_uid

    async def resolve(self, pod_uid: str, container: str) -> Any:
        from aggapi.agent.copy.fsroot import FsRoot
        return FsRoot(os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                      container_id="bench", pod_uid=pod_uid, container_name=container)

    async def by_id(self, container_id: str) -> Any:
        return None


async def _agent_main(pki_dir: str, root: str, state_dir: str, pod_uid: str) -> None:
    """The real agent app (auth middleware, copy handlers), container root = ``root``."""
    from aggapi.agent.app import build_app, new_parts
    from aggapi.agent.auth import server_context
    from aggapi.agent.config import AgentConfig
    from aggapi.agent.copy.quotas import CopyLimits
    from aggapi.auth.capability import CapabilityVerifier

    d = Path(pki_dir)
    config = AgentConfig(node_name=NODE, tls_cert=str(d / "agent.crt"),
                         tls_key=str(d / "agent.key"), client_ca=str(d / "ca.crt"),
                         token_public_key=str(d / "token-signing.pub"), host="127.0.0.1",
                         port=0, kubelet_config="/nonexistent",
                         copy=CopyLimits(size_limit=1 << 40, state_dir=state_dir))
    verifier = CapabilityVerifier((d / "token-signing.pub").read_bytes(), NODE)
    # No CRI here: pod_check off, and the copy resolver swapped for the directory.
    parts = new_parts(config, cri=None, containerd=None,  # type: ignore[arg-type]
                      verifier=verifier, copy_resolver=_DirResolver(root, pod_uid))
    app = build_app(parts, pod_check=False)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           read_bufsize=serving.READ_BUFSIZE)  # as aggapi.agent.main
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(
        config.tls_cert, config.tls_key, config.client_ca))
    await site.start()
    _announce(f"https://127.0.0.1:{runner.addresses[0][1]}")
    await asyncio.Event().wait()


SERVERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "baseline": _baseline_main, "agent": _agent_main, "proxy": _proxy_main}


def _announce(url: str) -> None:
    print(url, flush=True)


@asynccontextmanager
async def child(kind: str, *args: str) -> AsyncIterator[tuple[str, int]]:
    """``python3 -m benchmarks.bench_copy --serve KIND ARGS...`` (a fresh interpreter, so
    its RSS holds only what that server imports); yields (url, pid)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bench_copy", "--serve", kind, *args,
        stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            raise RuntimeError(f"{kind} server exited with {await proc.wait()}")
        yield line.decode().strip(), proc.pid
    finally:
        await stop_process(proc)


# --- client --------------------------------------------------------------------------

async def _body(size: int) -> AsyncIterator[bytes]:
    block = os.urandom(CHUNK)
    left = size
    while left:
        yield block[:min(left, CHUNK)]
        left -= min(left, CHUNK)


async def _drain(resp: aiohttp.ClientResponse) -> int:
    n = 0
    while data := await resp.content.read(CHUNK):
        n += len(data)
    return n


@dataclass
class Leg:
    name: str
    session: aiohttp.ClientSession
    path: str  # "" for the baseline
    headers: dict[str, str]
    token: Callable[[str, str], str] | None = None  # (operation, path) -> agent token


async def _timed_upload(leg: Leg, size: int, file: str) -> float:
    headers = {**leg.headers, "Content-Length": str(size)}
    if leg.token:
        headers["Authorization"] = "Bearer " + leg.token("copy.upload", file)
    t = time.perf_counter()
    if not leg.path:
        async with leg.session.post("/sink", data=_body(size), headers=headers) as r:
            assert r.status == 200 and (await r.json())["size"] == size
    else:
        async with leg.session.post(leg.path, params={"container": "app", "path": file},
                                    data=_body(size), headers=headers) as r:
            assert r.status in (200, 201), (leg.name, r.status, await r.text())
            assert (await r.json())["size"] == size
    return time.perf_counter() - t


async def _timed_download(leg: Leg, size: int, file: str) -> float:
    headers = dict(leg.headers)
    if leg.token:
        headers["Authorization"] = "Bearer " + leg.token("copy.download", file)
    t = time.perf_counter()
    if not leg.path:
        async with leg.session.get("/source", params={"size": str(size)},
                                   headers=headers) as r:
            assert r.status == 200 and await _drain(r) == size
    else:
        async with leg.session.get(leg.path, params={"container": "app", "path": file},
                                   headers=headers) as r:
            assert r.status == 200, (leg.name, r.status, await r.text())
            assert await _drain(r) == size
    return time.perf_counter() - t


def ncp_kubeconfig(p: Pki, work: Path, server: str) -> str:
    """The user's client certificate straight at the apiserver (no kube-apiserver)."""
    path = work / "ncp.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {
            "server": server, "certificate-authority": p.path("ca.crt")}}],
        "users": [{"name": USER, "user": {"client-certificate": p.path("user.crt"),
                                           "client-key": p.path("user.key")}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": USER}}]}))
    return str(path)


async def _ncp(kubeconfig: str, src: str, dst: str, spy: str | None = None) -> float:
    """One ncp run; ``spy``: under ``py-spy record`` into that file (raw stacks)."""
    argv = [sys.executable, "-m", "aggapi.plugins.ncp", "-q", f"--kubeconfig={kubeconfig}",
            src, dst]
    if spy:
        argv = ["py-spy", "record", "-r", "97", "-n", "-f", "raw", "-o", spy, "--", *argv]
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return time.perf_counter() - t


@asynccontextmanager
async def _spying(leg: str, direction: str, pids: dict[str, int]) -> AsyncIterator[None]:
    """Under ``BENCH_PYSPY=DIR``: py-spy attached to the agent (and, on the apiserver leg,
    the apiserver) for one transfer, its raw stacks written when it is interrupted."""
    out = os.environ.get("BENCH_PYSPY")
    who = {"agent": ["agent"], "apiserver": ["agent", "apiserver"]}.get(leg, [])
    spies = [await asyncio.create_subprocess_exec(
        "py-spy", "record", "-r", "97", "-n", "-f", "raw",
        "-o", f"{out}/{leg}-{direction}-{k}.txt", "--pid", str(pids[k]),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        for k in who] if out else []
    if spies:
        await asyncio.sleep(1)  # attached before the first byte
    try:
        yield
    finally:
        for s in spies:
            s.send_signal(signal.SIGINT)
            await s.wait()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


async def run(size: int, work: Path, with_proxy: bool, rounds: int,
              with_ncp: bool = False) -> dict[str, Any]:
    p, root, pod_uid, kube, signer = await fake_pod(work)
    # Baseline: same kind of TLS (a leaf of aggapi's CA for 127.0.0.1) and client.
    base_ctx = ssl.create_default_context(cafile=p.path("ca.crt"))

    def token(op: str, path: str) -> str:
        return signer.sign(node=NODE, subject=USER, operation=op, pod_namespace="default",
                           pod_name="box", pod_uid=pod_uid,
                           containers=(ContainerRef("app", "busybox"),), path=path)

    results: dict[str, dict[str, float]] = {}
    sessions: list[aiohttp.ClientSession] = []
    pids: dict[str, int] = {}

    def session(url: str, ctx: ssl.SSLContext | None) -> aiohttp.ClientSession:
        s = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=ctx or False),
                                  timeout=aiohttp.ClientTimeout(total=None))
        sessions.append(s)
        return s

    cpu: dict[tuple[str, str], dict[str, float]] = {}  # (leg, dir) -> process -> CPU s

    async def cpu_of(leg: Leg, direction: str, transfer: Coroutine[Any, Any, float]) -> float:
        procs = {**pids, "client": os.getpid()}
        async with _spying(leg.name, direction, pids):
            before = {k: cpu_seconds(v) for k, v in procs.items()}
            ncp0 = _children_cpu()
            took = await transfer
        used = cpu.setdefault((leg.name, direction), {})
        for k, v in procs.items():
            used[k] = used.get(k, 0.0) + (cpu_seconds(v) - before[k]) / rounds
        if leg.name == "ncp":  # the client is the ncp process, not this one
            used["client"] = used.get("client", 0.0) + (_children_cpu() - ncp0) / rounds
        return took

    local = work / "payload.bin"
    if with_ncp:
        with local.open("wb") as f:
            for _ in range(size // CHUNK):
                f.write(os.urandom(CHUNK))

    def as_if_written_elsewhere(file: str) -> None:
        """As if the container had just written the file: a new ctime, so the agent's
        digest cache (seeded by the upload) does not spare the download the whole-file
        sha256 a file from anywhere else costs; and every page in the page cache,
        whether or not the upload went through it (O_DIRECT), so the download's
        figures do not depend on how the upload wrote."""
        target = root / file.lstrip("/")
        os.utime(target)
        with target.open("rb") as f:
            while f.read(CHUNK):
                pass

    async def measure(leg: Leg) -> None:
        file = f"/big-{leg.name}"
        if leg.name == "ncp":
            remote = f"default/box:{file}"
            spy = os.environ.get("BENCH_NCP_PYSPY")  # a directory: profile the ncp client
            up = await cpu_of(leg, "upload", _ncp(leg.path, str(local), remote,
                                                  spy and f"{spy}/ncp-upload.txt"))
            as_if_written_elsewhere(file)
            down = await cpu_of(leg, "download", _ncp(leg.path, remote, str(work / "back"),
                                                      spy and f"{spy}/ncp-download.txt"))
            os.unlink(work / "back")
        else:
            up = await cpu_of(leg, "upload", _timed_upload(leg, size, file))
            if leg.path:
                as_if_written_elsewhere(file)
            down = await cpu_of(leg, "download", _timed_download(leg, size, file))
        mib = size / (1 << 20)
        best = results.setdefault(leg.name, {"upload_MiB_s": 0.0, "download_MiB_s": 0.0})
        best["upload_MiB_s"] = max(best["upload_MiB_s"], mib / up)
        best["download_MiB_s"] = max(best["download_MiB_s"], mib / down)
        if leg.path:
            os.unlink(root / file.lstrip("/"))
        print(f"  {leg.name}: up {mib / up:.0f} MiB/s, down {mib / down:.0f} MiB/s",
              file=sys.stderr, flush=True)

    path = f"{GV}/watch/namespaces/default/pods/box/copy"
    try:
        async with AsyncExitStack() as stack:
            burl, bpid = await stack.enter_async_context(
                child("baseline", p.path("apiserver.crt"), p.path("apiserver.key")))
            aurl, apid = await stack.enter_async_context(
                child("agent", str(p.dir), str(root), str(work / "state"), pod_uid))
            kube.put("apis/discovery.k8s.io/v1", "endpointslices",
                     endpoint_slice(int(aurl.rsplit(":", 1)[1])))
            url, api = await stack.enter_async_context(apiserver_process(p, kube, work))
            pids.update({"baseline_server": bpid, "agent": apid, "apiserver": api.pid})
            legs = [Leg("baseline", session(burl, base_ctx), "", {}),
                    Leg("agent", session(aurl, p.agent_client_ssl()), "/v1/copy", {}, token),
                    Leg("apiserver", session(url, p.user_ssl()), path, {})]
            if with_proxy:
                purl, pids["proxy"] = await stack.enter_async_context(
                    front_proxy_process(p, url))
                legs.append(Leg("proxy", session(purl, None), path,
                                {"Authorization": f"Bearer {PROXY_TOKEN}"}))
            if with_ncp:  # path: the kubeconfig
                legs.append(Leg("ncp", legs[0].session, ncp_kubeconfig(p, work, url), {}))
            idle = {k: rss_mib(v) for k, v in pids.items()}
            # Legs interleaved, rounds repeated: on shared CPUs each leg keeps its best.
            for _ in range(rounds):
                for leg in legs:
                    await measure(leg)
            peak = {k: peak_rss_mib(v) for k, v in pids.items()}
    finally:
        for s in sessions:
            await s.close()
        await kube.stop()
    peak["client (this process)"] = peak_rss_mib()
    gib = size / (1 << 30)
    cpu_per_gib = {f"{leg} {d}": {k: v / gib for k, v in used.items() if v > 0.005 * gib}
                   for (leg, d), used in cpu.items()}
    return {"throughput": results, "peak_rss_mib": peak, "idle_rss_mib": idle,
            "cpu_s_per_gib": cpu_per_gib}


def report(size_mib: int, rounds: int, res: dict[str, Any]) -> None:
    thr: dict[str, dict[str, float]] = res["throughput"]
    base = thr["baseline"]
    print(f"copy of {size_mib} MiB, 1 MiB client chunks, 127.0.0.1, {os.cpu_count()} CPUs "
          f"(shared), best of {rounds} interleaved round(s)")
    print(f"{'leg':>10} {'upload MiB/s':>13} {'x base':>7} {'download MiB/s':>15} "
          f"{'x base':>7}")
    for name, r in thr.items():
        print(f"{name:>10} {r['upload_MiB_s']:>13.0f} "
              f"{r['upload_MiB_s'] / base['upload_MiB_s']:>7.2f} "
              f"{r['download_MiB_s']:>15.0f} "
              f"{r['download_MiB_s'] / base['download_MiB_s']:>7.2f}")
    print("peak RSS (VmHWM), MiB: " + ", ".join(
        f"{k} {v:.1f}" for k, v in res["peak_rss_mib"].items()))
    print("RSS before the first transfer (VmRSS), MiB: " + ", ".join(
        f"{k} {v:.1f}" for k, v in res["idle_rss_mib"].items()))
    # Every process on the path pays for TLS (and the agent for the disk) per byte; on
    # a machine of N cores no leg can beat N / (its CPU-seconds per GiB) GiB/s.
    cores = os.cpu_count() or 1
    print(f"CPU-seconds per GiB moved (mean of rounds), and the ceiling that puts on "
          f"{cores} cores:")
    for leg_dir, used in res["cpu_s_per_gib"].items():
        total = sum(used.values())
        # With a core for each process (a real cluster: client, kube-apiserver, aggapi and
        # the agent on different machines), the busiest process sets the pace instead.
        busiest = max(used.items(), key=lambda kv: kv[1])
        print(f"  {leg_dir:>20}: " + ", ".join(f"{k} {v:.2f}" for k, v in used.items())
              + f"; total {total:.2f} -> ceiling {1024 * cores / total:.0f} MiB/s here, "
              f"{1024 / busiest[1]:.0f} MiB/s with a core each ({busiest[0]})")
    api = thr.get("apiserver")
    if api:
        ratio = min(api["upload_MiB_s"] / base["upload_MiB_s"],
                    api["download_MiB_s"] / base["download_MiB_s"])
        servers = {k: v for k, v in res["peak_rss_mib"].items() if not k.startswith("client")}
        print(f"goal apiserver >= 0.5x baseline: worst {ratio:.2f}x -> "
              f"{'met' if ratio >= 0.5 else 'NOT met'}")
        # Issue 15: the agent's own CPU per GiB (called directly), and the relay no worse
        # than the issue's "today" (see the docstring for why not 1.5).
        cpu_goals = (("agent upload", "agent", 2.2), ("agent download", "agent", 1.6),
                     ("apiserver upload", "apiserver", 2.7),
                     ("apiserver download", "apiserver", 2.7))
        for leg_dir, proc, limit in cpu_goals:
            got = res["cpu_s_per_gib"].get(leg_dir, {}).get(proc)
            if got is not None:
                print(f"goal {proc} CPU on {leg_dir} <= {limit} CPU-s/GiB: {got:.2f} -> "
                      f"{'met' if got <= limit else 'NOT met'}")
        worst = max(servers.items(), key=lambda kv: kv[1])
        print(f"goal peak RSS < 100 MB (95.4 MiB): worst {worst[0]} {worst[1]:.1f} MiB -> "
              f"{'met' if worst[1] < 100e6 / (1 << 20) else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--no-proxy", action="store_true", help="skip the front-proxy leg")
    ap.add_argument("--ncp", action="store_true",
                    help="add the ncp plugin (client CPU per GiB) straight at the apiserver")
    ap.add_argument("--rounds", type=int, default=2,
                    help="all legs again, interleaved; each leg reports its best round")
    ap.add_argument("--serve", nargs="+", metavar=("KIND", "ARG"),
                    help=argparse.SUPPRESS)  # internal: run one server (a child process)
    args = ap.parse_args()
    if args.serve:
        eventloop.run(SERVERS[args.serve[0]](*args.serve[1:]))
        return
    work = Path(tempfile.mkdtemp(prefix="bench-copy-"))
    try:
        res = eventloop.run(run(args.size_mib << 20, work, not args.no_proxy, args.rounds,
                                args.ncp))
        report(args.size_mib, args.rounds, res)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
