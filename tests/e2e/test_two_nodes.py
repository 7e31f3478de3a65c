"""A real two-node cluster (tests.framework.cluster): nodes, pod network, Services.

Each node is its own PID, mount and network namespaces running containerd, kubelet and
kube-proxy (iptables). Proven here, with the cluster's own controllers and nothing
standing in for them:

- both Nodes are Ready by their kubelets, with the pod CIDRs and InternalIPs given;
- a DaemonSet gets one pod per node from the daemonset controller;
- a pod on node 1 reaches a pod on node 2 by pod IP, and through a ClusterIP Service
  whose one backend is on node 2 (kube-proxy of node 1 DNATs it);
- a pod reaches kube-apiserver through the ``kubernetes`` ClusterIP Service with its
  own projected ServiceAccount token (the aggapi image's python3, imported into every
  node's containerd);
- kube-apiserver reaches a pod on each node: exec, logs (kubelet on the node's address)
  and the pods/proxy subresource (pod IP, routed by the host);
- a hostPID pod sees its node as the agent DaemonSet needs: PID 1 is the node's init,
  /proc/1/root/var/lib/kubelet/config.yaml is that node's, hostPath /run/containerd too;
- the teardown leaves no process, network namespace, mount or cgroup behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.framework.cluster import AGGAPI_IMAGE, AGGAPI_IMAGE_ARCHIVE, Cluster, leftovers
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import pod_manifest
from tests.framework.kubetools import kube_version
from tests.framework.node import Node
from tests.framework.procs import start_time

pytestmark = pytest.mark.e2e

NS = "default"
DS = "tn-web"
PINNED = "tn-web-2"  # a pod bound to node 2, the one backend of Service PINNED
PORT = 8080
SA_USER = "system:serviceaccount:default:default"
# Serves its own name (the pod's hostname) on :8080 and logs each request (-v).
HTTPD = ("/bin/busybox mkdir -p /tmp/www && /bin/busybox hostname > /tmp/www/index.html"
         f" && echo serving $(/bin/busybox hostname) && exec /bin/busybox httpd -f -v"
         f" -p {PORT} -h /tmp/www")
WHOAMI = """
import json, os, ssl, urllib.request
d = "/var/run/secrets/kubernetes.io/serviceaccount/"
url = "https://%s:%s/apis/authentication.k8s.io/v1/selfsubjectreviews" % (
    os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"])
req = urllib.request.Request(url, method="POST", data=json.dumps(
    {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode(),
    headers={"Authorization": "Bearer " + open(d + "token").read(),
             "Content-Type": "application/json"})
ctx = ssl.create_default_context(cafile=d + "ca.crt")
print(json.dumps({"host": os.environ["KUBERNETES_SERVICE_HOST"],
                  "review": json.load(urllib.request.urlopen(req, context=ctx, timeout=10))}))
"""


def kget(cp: ControlPlane, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(cp.kubectl("get", "-o", "json", *args).stdout)
    return out


def wait_for(ok: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = ok()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def exec_out(cp: ControlPlane, pod: str, *argv: str) -> str:
    return cp.kubectl("exec", "-n", NS, pod, "--", *argv).stdout


def fetch(cp: ControlPlane, pod: str, host: str, port: int) -> str:
    """GET / on ``host:port`` from inside ``pod``: the body ("" on failure). busybox nc,
    as this busybox's wget crashes (static glibc)."""
    req = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | /bin/busybox nc -w 3 {host} {port}"
    r = cp.kubectl("exec", "-n", NS, pod, "--", "/bin/busybox", "sh", "-c", req, check=False)
    # kubectl's output was read as text: universal newlines already turned CRLF into LF.
    head, sep, body = r.stdout.replace("\r\n", "\n").partition("\n\n")
    return body.strip() if r.returncode == 0 and sep and " 200 " in head else ""


@pytest.fixture(scope="module")
def web(two_node_cluster: Cluster, node: Node) -> Iterator[dict[str, dict[str, Any]]]:
    """DaemonSet DS (one busybox httpd per node) and pod PINNED on node 2 behind Service
    PINNED; yields node name -> the DS pod on it."""
    cp = two_node_cluster.cp
    labels = {"app": DS}
    container = {"name": "web", "image": node.images.busybox, "imagePullPolicy": "IfNotPresent",
                 "command": ["/bin/busybox", "sh", "-c", HTTPD]}
    n2 = two_node_cluster.nodes[1].name
    pinned = pod_manifest(PINNED, [container], node=n2, labels={"app": PINNED})
    cp.apply([
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DS, "namespace": NS},
         "spec": {"selector": {"matchLabels": labels}, "template": {
             "metadata": {"labels": labels},
             "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
                      "enableServiceLinks": False, "containers": [container]}}}},
        pinned,
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": PINNED, "namespace": NS},
         "spec": {"selector": {"app": PINNED},
                  "ports": [{"name": "http", "port": 80, "targetPort": PORT}]}},
    ])
    try:
        def running() -> dict[str, dict[str, Any]] | None:
            pods = kget(cp, "pods", "-n", NS, "-l", f"app={DS}")["items"]
            ok = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"
                  and p["status"].get("podIP")]
            return {p["spec"]["nodeName"]: p for p in ok} if len(ok) == 2 else None

        by_node = wait_for(running, 90, f"DaemonSet {DS}: a Running pod on each node")
        wait_for(lambda: (kget(cp, "pod", "-n", NS, PINNED).get("status") or {}).get(
            "phase") == "Running", 60, f"pod {PINNED} Running")
        yield by_node
    finally:
        cp.kubectl("delete", "-n", NS, f"daemonset/{DS}", f"service/{PINNED}",
                   f"pod/{PINNED}", "--ignore-not-found", "--grace-period=0", "--force",
                   "--wait=true", check=False)


def test_nodes_ready_with_their_pod_cidrs(two_node_cluster: Cluster) -> None:
    cp = two_node_cluster.cp
    print(f"\ntwo-node cluster up in {two_node_cluster.up_seconds:.1f}s")
    for n in two_node_cluster.nodes:
        obj = kget(cp, "node", n.name)
        assert obj["spec"]["podCIDR"] == n.pod_cidr
        addrs = {a["type"]: a["address"] for a in obj["status"]["addresses"]}
        assert addrs["InternalIP"] == n.address
        ready = [c for c in obj["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", ready
        assert ready[0]["reason"] == "KubeletReady"
        assert obj["status"]["nodeInfo"]["kubeletVersion"] == kube_version()
        assert obj["status"]["nodeInfo"]["kubeProxyVersion"] in ("", kube_version())
        assert n.kube_proxy.healthy()
    # The control plane's own node is kept out of scheduling while the cluster is up.
    standin = kget(cp, "node", cp.node_name)
    assert any(t["key"] == "aggapi.io/standin-node" for t in standin["spec"].get("taints", []))


def test_daemonset_lands_one_pod_per_node(two_node_cluster: Cluster,
                                          web: dict[str, dict[str, Any]]) -> None:
    assert sorted(web) == sorted(n.name for n in two_node_cluster.nodes)
    for n in two_node_cluster.nodes:
        pod = web[n.name]
        owners = pod["metadata"]["ownerReferences"]
        assert [o["kind"] for o in owners] == ["DaemonSet"], owners
        prefix = n.pod_cidr.rsplit(".", 1)[0] + "."
        assert pod["status"]["podIP"].startswith(prefix), (n.pod_cidr, pod["status"])
        assert pod["status"]["hostIP"] == n.address
    ds = kget(two_node_cluster.cp, "daemonset", "-n", NS, DS)["status"]
    assert ds["desiredNumberScheduled"] == 2, ds


def test_pod_reaches_pod_on_the_other_node(two_node_cluster: Cluster,
                                           web: dict[str, dict[str, Any]]) -> None:
    cp = two_node_cluster.cp
    n1, n2 = (n.name for n in two_node_cluster.nodes)
    for src, dst in ((n1, n2), (n2, n1)):
        src_pod, dst_pod = web[src]["metadata"]["name"], web[dst]
        got = fetch(cp, src_pod, dst_pod["status"]["podIP"], PORT)
        assert got == dst_pod["metadata"]["name"], (src, dst)


def test_clusterip_service_backend_on_the_other_node(two_node_cluster: Cluster,
                                                    web: dict[str, dict[str, Any]]) -> None:
    cp = two_node_cluster.cp
    n1 = two_node_cluster.nodes[0].name
    svc = kget(cp, "service", "-n", NS, PINNED)
    ip = svc["spec"]["clusterIP"]
    pinned = kget(cp, "pod", "-n", NS, PINNED)
    assert pinned["spec"]["nodeName"] == two_node_cluster.nodes[1].name
    src = web[n1]["metadata"]["name"]
    # kube-proxy of node 1 syncs once the endpointslice controller lists the pod.
    got = wait_for(lambda: fetch(cp, src, ip, 80), 60,
                   f"{src} -> Service {PINNED} ({ip})")
    assert got == PINNED


@pytest.fixture(scope="module")
def aggapi_image(two_node_cluster: Cluster) -> str:
    if not AGGAPI_IMAGE_ARCHIVE.exists():
        pytest.skip(f"{AGGAPI_IMAGE_ARCHIVE} missing: run hack/build-image.sh")
    took = two_node_cluster.import_image()
    print(f"\n{AGGAPI_IMAGE} imported into both nodes in {took:.1f}s")
    return AGGAPI_IMAGE


def test_kubernetes_service_with_projected_token(two_node_cluster: Cluster,
                                                 aggapi_image: str) -> None:
    cp = two_node_cluster.cp
    name = "tn-whoami"
    pod = pod_manifest(name, [{"name": "py", "image": aggapi_image, "imagePullPolicy": "Never",
                               "command": ["python3", "-c", "import time; time.sleep(3600)"]}],
                       node=two_node_cluster.nodes[1].name)
    pod["spec"]["automountServiceAccountToken"] = True
    pod["spec"]["enableServiceLinks"] = True
    cp.apply([pod])
    try:
        wait_for(lambda: (kget(cp, "pod", "-n", NS, name).get("status") or {}).get(
            "phase") == "Running", 60, f"pod {name} Running")
        vols = kget(cp, "pod", "-n", NS, name)["spec"]["volumes"]
        assert any("serviceAccountToken" in s for v in vols
                   for s in (v.get("projected") or {}).get("sources", [])), vols
        out = json.loads(exec_out(cp, name, "python3", "-c", WHOAMI))
        kubernetes_ip = kget(cp, "service", "-n", "default", "kubernetes")["spec"]["clusterIP"]
        assert out["host"] == kubernetes_ip
        user = out["review"]["status"]["userInfo"]
        assert user["username"] == SA_USER
        # Bound to this pod: the token is the projected one, not a legacy Secret.
        assert user["extra"]["authentication.kubernetes.io/pod-name"] == [name]
    finally:
        cp.kubectl("delete", "pod", "-n", NS, name, "--grace-period=0", "--force",
                   "--wait=false", check=False)


def test_apiserver_reaches_a_pod_on_each_node(two_node_cluster: Cluster,
                                              web: dict[str, dict[str, Any]]) -> None:
    cp = two_node_cluster.cp
    for n in two_node_cluster.nodes:
        pod = web[n.name]["metadata"]["name"]
        assert exec_out(cp, pod, "/bin/busybox", "hostname").strip() == pod
        # The proxy subresource: kube-apiserver dials the pod IP (routed via the node).
        body = cp.kubectl("get", "--raw",
                          f"/api/v1/namespaces/{NS}/pods/{pod}:{PORT}/proxy/").stdout
        assert body.strip() == pod
        logs = cp.kubectl("logs", "-n", NS, pod).stdout
        assert f"serving {pod}" in logs


def test_hostpid_pod_sees_its_own_node(two_node_cluster: Cluster, node: Node) -> None:
    """What the agent DaemonSet relies on, on each node: with hostPID, PID 1 is the node's
    init and /proc/1/root its mount namespace (the node's /var/lib/kubelet/config.yaml);
    hostPath /run/containerd is the node's own containerd directory."""
    cp = two_node_cluster.cp
    pods = []
    for n in two_node_cluster.nodes:
        pod = pod_manifest(f"tn-hostpid-{n.k}", [{
            "name": "look", "image": node.images.busybox,
            "securityContext": {"privileged": True},
            "volumeMounts": [{"name": "cri", "mountPath": "/host/run/containerd"}]}],
            node=n.name)
        pod["spec"]["hostPID"] = True
        pod["spec"]["volumes"] = [{"name": "cri", "hostPath": {
            "path": "/run/containerd", "type": "Directory"}}]
        pods.append(pod)
    cp.apply(pods)
    try:
        for n, pod in zip(two_node_cluster.nodes, pods, strict=True):
            name = pod["metadata"]["name"]
            wait_for(lambda name=name: (kget(cp, "pod", "-n", NS, name).get("status")
                                        or {}).get("phase") == "Running", 60, f"{name} Running")
            init = exec_out(cp, name, "/bin/busybox", "cat", "/proc/1/cmdline")
            assert "tests.framework.nodens" in init, init
            config = exec_out(cp, name, "/bin/busybox", "cat",
                              "/proc/1/root/var/lib/kubelet/config.yaml")
            assert f"address: {n.address}" in config.splitlines(), config
            sockets = exec_out(cp, name, "/bin/busybox", "ls", "/host/run/containerd")
            assert "containerd.sock" in sockets.split(), sockets
    finally:
        cp.kubectl("delete", "pod", "-n", NS, *(p["metadata"]["name"] for p in pods),
                   "--grace-period=0", "--force", "--wait=false", check=False)


def test_teardown_leaves_nothing_behind(two_node_cluster: Cluster,
                                        web: dict[str, dict[str, Any]]) -> None:
    """Last in this module: down, check by PID and by listing, then up again for any
    later user of the session's cluster."""
    cluster = two_node_cluster
    pids = {(n.name, w): (p, start_time(p)) for n in cluster.nodes
            for w, p in n.pids().items() if p is not None}
    assert len(pids) == 4 * len(cluster.nodes), pids
    t0 = time.monotonic()
    cluster.down()
    down = time.monotonic() - t0
    alive = {k: p for k, (p, st) in pids.items() if start_time(p) == st}
    assert not alive, alive
    assert leftovers(cluster.cp, cluster.nodes) == []
    standin = kget(cluster.cp, "node", cluster.cp.node_name)
    assert not any(t["key"] == "aggapi.io/standin-node"
                   for t in standin["spec"].get("taints") or [])
    took = cluster.up()
    print(f"\ntwo-node cluster: down {down:.1f}s, up again {took:.1f}s")
