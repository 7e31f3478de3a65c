"""A real multi-node cluster (two nodes by default) on the harness's control plane.

    control plane   etcd, kube-apiserver 10.251.N.1:6443, kube-controller-manager,
                    kube-scheduler (tests.framework.controlplane), unchanged
    registry        docker-registry + throttle proxy on 10.251.N.1 with the test images
                    (tests.framework.node; its host containerd is not a cluster node)
    node k          its own PID, mount and network namespaces (tests.framework.nodens)
                    running containerd, kubelet and kube-proxy
                    (tests.framework.clusternode): aggapi-worker-<k>, 10.251.N.(10+k),
                    pod CIDR 10.251.(128+8N+k).0/24

Routes (:meth:`Cluster.route`): the host reaches each pod CIDR via that node's address
(kube-apiserver dials pod IPs: aggregator routing, pods/proxy); each node reaches the
other nodes' pod CIDRs the same way and the Service CIDR via the host (for its own
processes; pods' ClusterIP traffic is DNATed by kube-proxy before it is routed); pods'
default route is their node's cni0. No default route anywhere leads off this machine and
the host does not forward (ip_forward stays 0): node-to-node traffic is bridged.

The control plane's own Node (``aggapi-node-1``, served by the kubelet stand-in or the
single-node kubelet) stays, but while the cluster is up it is tainted NoSchedule and loses
its ``kubernetes.io/os`` label, so the scheduler and DaemonSets (the agent's nodeSelector)
use the cluster's nodes only; ``down`` gives both back.

CLI: ``python3 -m tests.framework.cluster up|down|status|import-image [--instance local]``
(``up`` starts the control plane and the registry first if they are not running).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.framework import nodens, nodestate
from tests.framework.clusternode import ClusterNode, cluster_cidr, save
from tests.framework.controlplane import INSTANCES, SERVICE_CIDR, ControlPlane
from tests.framework.kubelet import KERNEL_TUNABLES
from tests.framework.kubetools import binary
from tests.framework.netns import ip
from tests.framework.node import Node
from tests.framework.procs import HarnessError, wait_ready

AGGAPI_IMAGE_ARCHIVE = Path(os.environ.get("AGGAPI_IMAGE_CACHE", "/var/cache/aggapi-image"),
                            "aggapi-dev.oci.tar")
AGGAPI_IMAGE = "localhost/aggapi:dev"
STANDIN_TAINT = "aggapi.io/standin-node"


def log(msg: str) -> None:
    print(f"cluster: {msg}", file=sys.stderr, flush=True)


class Cluster:
    """``up``/``down`` the nodes of ``cp``'s cluster; ``registry`` holds the images."""

    def __init__(self, cp: ControlPlane, registry: Node, *, nodes: int = 2) -> None:
        self.cp = cp
        self.registry = registry
        info = registry.info
        self.nodes = [ClusterNode(cp, k, sandbox_image=info.sandbox_image,
                                  registries=info.registry_hosts())
                      for k in range(1, nodes + 1)]
        self.up_seconds = 0.0

    @property
    def dir(self) -> Path:
        return self.cp.state / "nodes"

    @property
    def cluster_cidr(self) -> str:
        return cluster_cidr(self.cp)

    def node(self, name_or_index: str | int) -> ClusterNode:
        for n in self.nodes:
            if name_or_index in (n.name, n.k):
                return n
        raise KeyError(name_or_index)

    # --- up ------------------------------------------------------------------------------
    def up(self, *, timeout: float = 120.0) -> float:
        """Namespaces, containerd, routes, kubelets, kube-proxies; returns once every
        Node is Ready (by its kubelet) and every kube-proxy has synced. Seconds taken."""
        t0 = time.monotonic()
        self.down()  # leftovers of an interrupted run
        self.dir.mkdir(parents=True, exist_ok=True)
        for name in ("kubelet", "kube-proxy"):
            binary(name)
        self._record_sysctls()
        try:
            self._hide_standin_node()
            self.cp.apply([n.node_object() for n in self.nodes])
            for n in self.nodes:
                n.start_namespaces()
                save(n)
            self.route()
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda n: n.start_containerd(), self.nodes))
            # One at a time: the first may restart kube-apiserver with its --kubelet-* flags.
            for n in self.nodes:
                n.start_kubelet()
            for n in self.nodes:
                n.kube_proxy.start(n.ns.exec_prefix())
            deadline = time.monotonic() + timeout
            for n in self.nodes:
                left = max(1.0, deadline - time.monotonic())
                wait_ready(n.ready, left, f"{n.name} Ready", n.kubelet.proc())
                n.kube_proxy.wait(max(1.0, deadline - time.monotonic()))
        except BaseException:
            for n in self.nodes:
                log(f"{n.name} kubelet log:\n{n.kubelet.tail(15)}")
            self.down()
            raise
        self.up_seconds = time.monotonic() - t0
        (self.dir / "cluster.json").write_text(json.dumps(self.describe(), indent=2) + "\n")
        return self.up_seconds

    def route(self) -> None:
        """Host and nodes route pod CIDRs to their nodes; nodes reach Services via the host."""
        svc = SERVICE_CIDR.split(",")[0]
        for n in self.nodes:
            ip("route", "replace", n.pod_cidr, "via", n.address)
            ip("-n", n.host.netns, "route", "replace", svc, "via", self.cp.net.host_address)
            for other in self.nodes:
                if other is not n:
                    ip("-n", n.host.netns, "route", "replace", other.pod_cidr,
                       "via", other.address)

    def describe(self) -> dict[str, Any]:
        return {"up_seconds": round(self.up_seconds, 2), "cluster_cidr": self.cluster_cidr,
                "registry": self.registry.info.registry_host,
                "release_registry": self.registry.info.auth_registry_host,
                "nodes": [{"name": n.name, "address": n.address, "pod_cidr": n.pod_cidr,
                           "netns": n.host.netns, "cri_address": n.cri_address,
                           "pids": n.pids()} for n in self.nodes]}

    # --- images --------------------------------------------------------------------------
    def import_image(self, archive: Path = AGGAPI_IMAGE_ARCHIVE) -> float:
        """``ctr -n k8s.io images import`` an OCI archive into every node's containerd
        (in parallel); pods then use it with imagePullPolicy Never. Seconds taken."""
        if not archive.exists():
            raise HarnessError(f"{archive} missing: run hack/build-image.sh")
        t0 = time.monotonic()

        def one(n: ClusterNode) -> None:
            r = subprocess.run(
                ["ctr", f"--address={n.cri_address}", "-n", "k8s.io", "images", "import",
                 f"--snapshotter={n.info.snapshotter or 'overlayfs'}", str(archive)],
                capture_output=True, text=True, timeout=300, check=False)
            if r.returncode != 0:
                raise HarnessError(f"{n.name}: ctr import {archive}: {r.stderr.strip()}")

        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(one, self.nodes))
        return time.monotonic() - t0

    # --- down ----------------------------------------------------------------------------
    def down(self) -> None:
        """Stop every node (by its init's PID), remove routes, netns, cgroups and host
        mountpoints, restore sysctls and the control plane's Node; keeps the registry."""
        nodens.teardown_all(self.cp.state, self.cp.net)
        for n in self.nodes:
            n.stop()
            ip("route", "del", n.pod_cidr, check=False)
        if self.cp.proc("kube-apiserver").alive():
            with contextlib.suppress(HarnessError, subprocess.TimeoutExpired):
                self.cp.kubectl("delete", "node", "--ignore-not-found", "--wait=false",
                                *(n.name for n in self.nodes), check=False)
            self._restore_standin_node()
        nodens.restore_sysctls(self.dir)
        shutil.rmtree(self.dir, ignore_errors=True)

    # --- host side effects ----------------------------------------------------------------
    def _record_sysctls(self) -> None:
        """kubelet sets global sysctls (docs/kubelet-harness.md): keep the originals once
        for all nodes (nodens.restore_sysctls puts them back)."""
        saved = self.dir / "sysctls.json"
        if saved.exists():
            return
        values = {}
        for k in KERNEL_TUNABLES:
            with contextlib.suppress(OSError):
                values[k] = Path("/proc/sys", k).read_text().strip()
        saved.write_text(json.dumps(values))

    def _hide_standin_node(self) -> None:
        name = self.cp.node_name
        if self.cp.get(f"/api/v1/nodes/{name}")[0] != 200:
            return
        self.cp.kubectl("taint", "node", name, f"{STANDIN_TAINT}=true:NoSchedule",
                        "--overwrite")
        self.cp.kubectl("label", "node", name, "kubernetes.io/os-")
        (self.dir / "standin-hidden").touch()

    def _restore_standin_node(self) -> None:
        marker = self.dir / "standin-hidden"
        if not marker.exists():
            return
        name = self.cp.node_name
        self.cp.kubectl("taint", "node", name, f"{STANDIN_TAINT}-", check=False)
        self.cp.kubectl("label", "node", name, "kubernetes.io/os=linux", "--overwrite",
                        check=False)
        marker.unlink()


def registry_of(cp: ControlPlane) -> Node:
    """The control plane's registry node: the running one, else a fresh one (no agent)."""
    if nodestate.has_node(cp.state):
        node = Node.load(cp)
        if all(node.proc(n).alive() for n in nodestate.NODE_PROCS):
            return node
        node.stop()
    node = Node(cp)
    node.start(agent=False)
    return node


def leftovers(cp: ControlPlane, nodes: Iterable[ClusterNode]) -> list[str]:
    """What a stopped cluster would have left behind (empty when clean): live PIDs,
    network namespaces, host mounts under the nodes' directories, cgroups."""
    out = []
    nodes = list(nodes)
    netns = ip("netns", "list").stdout
    for n in nodes:
        out += [f"{n.name}: {w} pid {p}" for w, p in n.pids().items() if p is not None]
        if n.host.netns in netns.split():
            out.append(f"{n.name}: netns {n.host.netns}")
        for hier in Path("/sys/fs/cgroup").iterdir():
            if (hier / n.info.cgroup_parent.lstrip("/")).exists():
                out.append(f"{n.name}: cgroup {hier.name}{n.info.cgroup_parent}")
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    nodes_dir = str(cp.state / "nodes") + "/"
    out += [f"mount {m.split()[4]}" for m in mounts if m.split()[4].startswith(nodes_dir)]
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            with contextlib.suppress(OSError):
                if nodes_dir.encode() in (p / "cmdline").read_bytes():
                    out.append(f"process {p.name}: {(p / 'cmdline').read_bytes()[:80]!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["up", "down", "status", "import-image"])
    p.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"),
                   choices=sorted(INSTANCES))
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--image", type=Path, default=AGGAPI_IMAGE_ARCHIVE,
                   help="import-image: the OCI archive (hack/build-image.sh)")
    a = p.parse_args(argv)
    cp = ControlPlane(instance=a.instance)
    if a.command == "up":
        if not cp.proc("kube-apiserver").alive():
            log(f"control plane up in {cp.up():.1f}s")
        cluster = Cluster(cp, registry_of(cp), nodes=a.nodes)
        log(f"{a.nodes} nodes Ready in {cluster.up():.1f}s")
        print(json.dumps(cluster.describe(), indent=2))
        return 0
    if a.command == "down":
        nodens.teardown_all(cp.state, cp.net)
        if cp.proc("kube-apiserver").alive() and nodestate.has_node(cp.state):
            Cluster(cp, Node.load(cp), nodes=a.nodes).down()  # + Node objects, taint
        shutil.rmtree(cp.state / "nodes", ignore_errors=True)
        return 0
    cluster = Cluster(cp, Node.load(cp), nodes=a.nodes)
    if a.command == "import-image":
        log(f"{a.image} imported into every node in {cluster.import_image(a.image):.1f}s")
    else:
        desc = cluster.describe()
        for n, d in zip(cluster.nodes, desc["nodes"], strict=True):
            d["ready"] = n.ready() if n.kubelet.proc().alive() else False
            d["kube-proxy healthy"] = n.kube_proxy.healthy()
        print(json.dumps(desc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
