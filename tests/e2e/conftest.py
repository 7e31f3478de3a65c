"""e2e fixtures: a real control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) from tests.framework.controlplane, once per session.

Needs root (network namespaces) and the binaries of hack/build-binaries.sh, which the
``control_plane`` fixture builds on first use (cached in /var/cache/aggapi-bin afterwards).
Set AGGAPI_SKIP_E2E=1 to skip; AGGAPI_KEEP_E2E_STATE=1 keeps logs in .local/controlplane/e2e.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.framework.cluster import Cluster
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node
from tests.framework.pods import ContainerSpec
from tests.framework.procs import Proc
from tests.framework.repo import REPO
from tests.framework.standin import StandinKubelet, StandinPod, SyncStandin

APISERVER_MAIN = REPO / "aggapi/apiserver/main.py"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_cluster_order)


def _cluster_order(item: pytest.Item) -> int:
    """Tests on the two-node cluster run after every other test of the session: while it
    is up, the control plane's own Node is tainted, and the installed add-on replaces the
    harness's APIService, which the other e2e modules need. The cluster's own tests come
    first (one of them restarts it), then the installed add-on's (``installed_addon``
    holds its release until the session ends). The sort is stable: the rest keep their
    order."""
    names = set(getattr(item, "fixturenames", ()))
    if "installed_addon" in names:
        return 2
    return 1 if "two_node_cluster" in names else 0


def _skip_reason() -> str | None:
    if os.environ.get("AGGAPI_SKIP_E2E"):
        return "AGGAPI_SKIP_E2E is set"
    if os.geteuid() != 0:
        return "e2e needs root (network namespaces)"
    if not shutil.which("ip"):
        return "e2e needs iproute2"
    return None


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "etcd", "kubectl",
                    "kube-apiserver", "kube-controller-manager", "kube-scheduler"], check=True)
    built = time.monotonic() - t0
    # AGGAPI_E2E_INSTANCE=parallel runs beside another e2e session (own subnet and state).
    cp = ControlPlane(instance=os.environ.get("AGGAPI_E2E_INSTANCE", "e2e"))
    cp.down()  # leftovers of an interrupted run
    try:
        took = cp.up()
        print(f"\ncontrol plane: binaries {built:.1f}s, up {took:.1f}s")
        yield cp
    finally:
        cp.down(keep_state=bool(os.environ.get("AGGAPI_KEEP_E2E_STATE")))


@pytest.fixture(scope="module")
def aggapi_apiserver(control_plane: ControlPlane) -> Iterator[Proc]:
    """``aggapi apiserver`` running in its namespace, the APIService Available.

    Module-scoped: other modules may put a stand-in on the same address meanwhile.
    """
    if not APISERVER_MAIN.exists():
        pytest.skip("aggapi/apiserver/main.py not in the tree yet")
    proc = control_plane.start_apiserver()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def aggapi_agent(control_plane: ControlPlane) -> Iterator[Proc]:
    """``aggapi agent`` in the node's namespace, with no container runtime behind it.

    Enough to prove the apiserver -> agent leg (EndpointSlice nodeName, mTLS, token);
    tests that need containers start containerd and pass its socket themselves.
    """
    if not (REPO / "aggapi/agent/main.py").exists():
        pytest.skip("aggapi/agent/main.py not in the tree yet")
    missing = control_plane.state / "no-runtime.sock"
    proc = control_plane.start_agent(cri_socket=str(missing))
    try:
        yield proc
    finally:
        proc.stop()


# --- the node: containerd + registry + throttle + images + agent, and a kubelet stand-in ---
# (tests.framework.node / tests.framework.standin). No kubelet runs: the stand-in creates Pod
# objects bound to the node, drives containerd through CRI with kubelet's labels, and posts
# kubelet's events and container statuses.

GROUP_VERSION = "/apis/subresources.aggapi.io/v1alpha1"


@pytest.fixture(scope="session")
def node(control_plane: ControlPlane) -> Iterator[Node]:
    """Session: registry, throttle proxy, images, containerd for the e2e node (no agent:
    see ``node_agent``; tests/e2e/test_controlplane.py runs its own runtime-less agent)."""
    n = Node(control_plane)
    try:
        took = n.start(agent=False)
        print(f"\nnode: up in {took:.1f}s (containerd {n.cri_address})")
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def node_agent(node: Node, aggapi_apiserver: Proc) -> Iterator[Proc]:
    """``aggapi agent`` on the node with containerd behind it (module-scoped, like
    ``aggapi_agent``: both use the agent's address, one module at a time)."""
    if not (REPO / "aggapi/agent/main.py").exists():
        pytest.skip("aggapi/agent/main.py not in the tree yet")
    proc = node.start_agent()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def kubelet(control_plane: ControlPlane, node: Node) -> Iterator[Kubelet]:
    """A real kubelet for this module (serializeImagePulls: true, kubelet's default).

    Module-scoped: the CRI stand-in's pods (other modules) carry kubelet's labels, and
    a running kubelet would take them over."""
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "kubelet"], check=True)
    k = Kubelet(control_plane, node)
    try:
        took = k.start()
        print(f"\nkubelet: built/cached {time.monotonic() - t0 - took:.1f}s, Ready in {took:.1f}s")
        yield k
    finally:
        if k.proc().alive():
            k.delete_pods()
        k.stop()


@pytest.fixture(scope="session")
def two_node_cluster(control_plane: ControlPlane, node: Node) -> Iterator[Cluster]:
    """Two real nodes (tests.framework.cluster): each its own PID, mount and network
    namespaces with containerd, kubelet and kube-proxy; pulls from ``node``'s registry.

    Session-scoped. While it is up the control plane's own Node is tainted NoSchedule
    (the stand-in's pods, bound by name, still run there)."""
    t0 = time.monotonic()
    subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "kubelet", "kube-proxy"],
                   check=True)
    built = time.monotonic() - t0
    cluster = Cluster(control_plane, node)
    try:
        took = cluster.up()
        print(f"\ntwo-node cluster: binaries {built:.1f}s, up {took:.1f}s")
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def standin(node: Node) -> Iterator[SyncStandin]:
    s = SyncStandin(node)
    yield s
    s.close()


@dataclass
class E2EPod:
    namespace: str
    name: str
    container: str
    image: str
    pod: StandinPod

    def path(self, sub: str, query: Mapping[str, str] | None = None, /, *,
             watch: bool = False, **params: str) -> str:
        """The ``sub`` subresource's URL path with the query ``query`` then ``params``
        (a mapping goes positionally, so no key of it can be mistaken for ``watch``)."""
        base = (f"{GROUP_VERSION}{'/watch' if watch else ''}/namespaces/{self.namespace}"
                f"/pods/{self.name}/{sub}")
        qs = "&".join(f"{k}={v}" for k, v in {**(query or {}), **params}.items())
        return f"{base}?{qs}" if qs else base


def run_pod(standin: SyncStandin, name: str, image: str, *,
            command: tuple[str, ...] = ()) -> E2EPod:
    spec = ContainerSpec("app", image, command=command)

    async def go(k: StandinKubelet) -> StandinPod:
        return await k.run(name, [spec])

    pod = standin.call(go)
    assert pod.running is not None, pod.pull_errors
    return E2EPod("default", name, "app", image, pod)


def delete_pod(standin: SyncStandin, pod: StandinPod) -> None:
    async def go(k: StandinKubelet) -> None:
        await k.delete(pod)

    standin.call(go)


@pytest.fixture(scope="module")
def workload_pod(request: pytest.FixtureRequest, standin: SyncStandin, node: Node,
                 node_agent: Proc) -> Iterator[E2EPod]:
    """A running busybox pod on the node (container ``app``, writable /tmp)."""
    name = "workload-" + request.module.__name__.rsplit(".", 1)[-1].replace("_", "-")[-30:]
    pod = run_pod(standin, name, node.images.busybox)
    try:
        yield pod
    finally:
        delete_pod(standin, pod.pod)


def remove_big_image(standin: SyncStandin, node: Node) -> None:
    """Forget the big image under both names, so the next pull downloads every byte."""
    async def go(k: StandinKubelet) -> None:
        for ref in (node.via_throttle(node.images.big), node.via_registry(node.images.big)):
            await k.remove_image(ref)

    standin.call(go)


@dataclass
class PullingPod(E2EPod):
    pull: Any = None  # concurrent.futures.Future of the stand-in's pull + start


def start_pulling_pod(standin: SyncStandin, node: Node, name: str, rate: float, *,
                      start: bool = True) -> PullingPod:
    """A pod whose big image is being pulled through the throttle at ``rate`` bytes/s
    (``start=False``: the Pod object only; call ``begin_pull`` when ready)."""
    remove_big_image(standin, node)
    node.set_rate(rate)
    image = node.via_throttle(node.images.big)
    spec = ContainerSpec("app", image)

    async def create(k: StandinKubelet) -> StandinPod:
        return await k.create(name, [spec])

    p = PullingPod("default", name, "app", image, standin.call(create))
    if start:
        begin_pull(standin, p)
    return p


def begin_pull(standin: SyncStandin, p: PullingPod) -> None:
    """The stand-in pulls (events, CRI) and starts the pod, in the background."""
    async def start(k: StandinKubelet) -> StandinPod:
        return await k.start(p.pod)

    p.pull = standin.spawn(start)


def finish_pulling_pod(standin: SyncStandin, node: Node, p: PullingPod) -> None:
    node.set_rate(None)
    try:
        if p.pull is not None:
            p.pull.result(120)
    finally:
        delete_pod(standin, p.pod)
        remove_big_image(standin, node)


@pytest.fixture
def pulling_pod(standin: SyncStandin, node: Node, node_agent: Proc) -> Iterator[PullingPod]:
    """A pod whose ~150 MB image is being pulled through the throttle proxy (~10 s)."""
    total = sum(size for _, size in node.images.big_layers)
    p = start_pulling_pod(standin, node, "pulling", rate=total / 10)
    try:
        yield p
    finally:
        finish_pulling_pod(standin, node, p)


# --- real kubectl --------------------------------------------------------------------------

@dataclass
class KubectlRun:
    rc: int
    out: bytes
    err: str
    seconds: float

    def objects(self) -> list[dict[str, Any]]:
        """stdout as NDJSON; every line must parse (a truncated stream would not)."""
        import json

        return [json.loads(line) for line in self.out.decode().splitlines() if line.strip()]


def kubectl_argv(cp: ControlPlane, user: str | None, *args: str,
                 kubeconfig: Path | None = None) -> list[str]:
    kc = kubeconfig or (cp.admin_kubeconfig if user is None else cp.user_kubeconfig(user))
    return [binary("kubectl", build=False), f"--kubeconfig={kc}", *args]


async def kubectl(cp: ControlPlane, *args: str, user: str | None = "alice",
                  stdin: bytes | None = None, timeout: float = 120,
                  kubeconfig: Path | None = None) -> KubectlRun:
    """Run real kubectl as ``user`` (None: admin); binary-safe stdout."""
    import asyncio

    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *kubectl_argv(cp, user, *args, kubeconfig=kubeconfig),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return KubectlRun(proc.returncode, out, err.decode(errors="replace"),
                      time.monotonic() - t0)


@dataclass
class ApiReply:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def api_get(cp: ControlPlane, path: str, *, user: str = "alice",
                  timeout: float = 30) -> ApiReply:
    """GET ``path`` on kube-apiserver over HTTPS as ``user`` (their kubeconfig's client
    certificate), once: status, headers and body as they came, with no client retry."""
    import asyncio

    import aiohttp

    from aggapi.kube.kubeconfig import load_kubeconfig

    cfg = await asyncio.to_thread(load_kubeconfig, str(cp.user_kubeconfig(user)))
    assert cfg.ssl_context is not None  # the harness's kube-apiserver speaks only HTTPS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, \
            s.get(cfg.server + path, ssl=cfg.ssl_context) as r:
        return ApiReply(r.status, dict(r.headers), await r.read())


@dataclass
class Streamed:
    """A ``kubectl get --raw`` stream read line by line: (seconds since start, object)."""

    rc: int
    lines: list[tuple[float, dict[str, Any]]]
    raw: bytes
    err: str
    seconds: float

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [o for _, o in self.lines]


async def kubectl_stream(cp: ControlPlane, path: str, *, user: str = "alice",
                         timeout: float = 300) -> Streamed:
    import asyncio
    import json

    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *kubectl_argv(cp, user, "get", "--raw", path), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=1 << 22)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[tuple[float, dict[str, Any]]] = []
    raw = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            raw.extend(line)
            if line.strip():
                # json.loads fails loudly on a line cut in the middle.
                lines.append((time.monotonic() - t0, json.loads(line)))

    try:
        _, err = await asyncio.wait_for(asyncio.gather(read(), proc.stderr.read()), timeout)
        await proc.wait()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    assert proc.returncode is not None
    return Streamed(proc.returncode, lines, bytes(raw), err.decode(errors="replace"),
                    time.monotonic() - t0)


@pytest.fixture(scope="session")
def anonymous_kubeconfig(control_plane: ControlPlane) -> Path:
    """The cluster and its CA, no credentials at all."""
    import base64
    import json

    ca = (control_plane.pki_dir / "ca.crt").read_bytes()
    path = control_plane.state / "users" / "anonymous.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {
            "server": control_plane.server,
            "certificate-authority-data": base64.b64encode(ca).decode()}}],
        "users": [{"name": "nobody", "user": {}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "nobody"}}],
        "current-context": "c"}))
    return path
