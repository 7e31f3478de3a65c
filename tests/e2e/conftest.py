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
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.kubectlrun import (  # noqa: F401
    ApiReply,
    KubectlRun,
    Streamed,
    api_get,
    kubectl,
    kubectl_argv,
    kubectl_stream,
)
from tests.e2e.standinpods import (  # noqa: F401
    GROUP_VERSION,
    E2EPod,
    PullingPod,
    begin_pull,
    delete_pod,
    finish_pulling_pod,
    remove_big_image,
    run_pod,
    start_pulling_pod,
)
from tests.framework.cluster import Cluster
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node
from tests.framework.procs import Proc
from tests.framework.repo import REPO
from tests.framework.standin import SyncStandin

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
# The pods it runs: tests.e2e.standinpods.


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


@pytest.fixture
def pulling_pod(standin: SyncStandin, node: Node, node_agent: Proc) -> Iterator[PullingPod]:
    """A pod whose ~150 MB image is being pulled through the throttle proxy (~10 s)."""
    total = sum(size for _, size in node.images.big_layers)
    p = start_pulling_pod(standin, node, "pulling", rate=total / 10)
    try:
        yield p
    finally:
        finish_pulling_pod(standin, node, p)


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
