"""One node of the multi-node cluster (tests.framework.cluster): containerd, kubelet and
kube-proxy inside the node's namespaces (tests.framework.nodens).

Node ``k`` (1, 2, ...) of instance N (10.251.N.0/24):

    name            aggapi-worker-<k>
    netns           agg<i>-n<k>, eth0 10.251.N.(10+k)/24 on the control plane's bridge
    pod CIDR        10.251.(128+8N+k).0/24 (cluster CIDR 10.251.(128+8N).0/21), in the
                    Node's spec.podCIDR, on bridge cni0 inside the netns (gateway .1);
                    kubelet's maxPods MAX_PODS fits in it
    state           <control plane state>/nodes/n<k>/ (the directories bound over
                    /run/containerd, /var/lib/kubelet, ... inside: nodens.BINDS)
    containerd      socket /run/containerd/containerd.sock inside, i.e.
                    nodes/n<k>/run-containerd/containerd.sock here; pulls from the
                    registry and throttle proxy on 10.251.N.1 (tests.framework.node)
    kubelet         https://10.251.N.(10+k):10250, root dir and config.yaml in
                    /var/lib/kubelet (inside), cgroupRoot /aggapi-<instance>-n<k>
    kube-proxy      iptables mode in the node's netns, user system:kube-proxy

kubelet and containerd run in the host's cgroup hierarchy (no cgroup namespace): pods'
cgroups go under the node's cgroupRoot, removed at stop.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.framework.containerd import Containerd, remove_cgroup_tree
from tests.framework.controlplane import INSTANCES, ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.kubeproxy import KubeProxy
from tests.framework.kubetools import has
from tests.framework.nodens import NodeNamespaces
from tests.framework.nodestate import NodeInfo
from tests.framework.procs import HarnessError, Proc, spawn, wait_ready

CRI_SOCKET = "/run/containerd/containerd.sock"  # inside the node
KUBELET_DIR = "/var/lib/kubelet"  # inside the node
MAX_PODS = 240  # per node (NodeKubelet.config)


def cluster_cidr(cp: ControlPlane) -> str:
    return f"10.251.{128 + 8 * INSTANCES[cp.instance]}.0/21"


class ClusterNode:
    """Node ``k`` of ``cp``'s cluster: start() its namespaces and daemons, stop() them."""

    def __init__(self, cp: ControlPlane, k: int, *, registries: tuple[str, ...] = (),
                 sandbox_image: str = "") -> None:
        if not 1 <= k <= 7:
            raise HarnessError("node index must be 1..7 (pod CIDRs of the /21)")
        self.cp = cp
        self.k = k
        self.name = f"aggapi-worker-{k}"
        self.dir = cp.state / "nodes" / f"n{k}"
        self.host = cp.net.host(f"n{k}", 10 + k)
        self.ns = NodeNamespaces(cp.net, self.host, self.dir, cp.state, f"node{k}")
        self.registries = registries
        self.info = NodeInfo(containerd_dir=str(self.dir / "containerd"),
                             cgroup_parent=f"/aggapi-{cp.instance}-n{k}",
                             sandbox_image=sandbox_image)
        self.kubelet = NodeKubelet(cp, self)
        self._started = 0.0
        self.kube_proxy = KubeProxy(
            cp, node_name=self.name, address=self.address, cluster_cidr=cluster_cidr(cp),
            workdir=self.dir / "kube-proxy", proc=self.proc("kube-proxy"))

    # --- names -------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return self.host.address

    @property
    def pod_cidr(self) -> str:
        base = 128 + 8 * INSTANCES[self.cp.instance]
        return f"10.251.{base + self.k}.0/24"

    @property
    def cri_address(self) -> str:
        """The node's CRI/containerd socket as this (host) side reaches it."""
        return str(self.ns.path(CRI_SOCKET))

    def proc(self, what: str) -> Proc:
        return Proc.named(self.cp.state, f"node{self.k}-{what}")

    def node_object(self) -> dict[str, Any]:
        """The Node as the harness creates it before kubelet registers: its pod CIDR
        (kube-controller-manager does not allocate them here)."""
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": {
                    "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux"}},
                "spec": {"podCIDR": self.pod_cidr, "podCIDRs": [self.pod_cidr]}}

    # --- lifecycle -----------------------------------------------------------------------
    def start_namespaces(self) -> None:
        self.ns.start()

    def start_containerd(self, timeout: float = 20.0) -> None:
        Path(self.info.containerd_dir).mkdir(parents=True, exist_ok=True)
        ctd = Containerd(self.info.containerd_dir, sandbox_image=self.info.sandbox_image)
        ctd.address = self.cri_address
        ctd.listen_address = CRI_SOCKET
        ctd.cgroup_parent = self.info.cgroup_parent
        for host in self.registries:
            ctd.add_registry(host)
        self.info.snapshotter = ctd.snapshotter
        cfg = ctd.write_config()
        p = spawn(self.proc("containerd").name,
                  [*self.ns.exec_prefix(), ctd.binary, "--config", str(cfg)], self.cp.state,
                  env=ctd.env())
        wait_ready(ctd.socket_ready, timeout, f"{self.name}: containerd", p, poll=0.02)

    def start_kubelet(self) -> float:
        """Start kubelet (not waiting for Ready: see :meth:`ready`)."""
        self._started = time.time()
        return self.kubelet.start(wait=0)

    def ready(self) -> bool:
        """Ready by this kubelet: a heartbeat since it started (not a previous run's)."""
        return self.kubelet.node_ready(since=self._started)

    def stop(self) -> None:
        """Kill the node (its init takes every process of it along), then remove its
        cgroups and network namespace. The state directory stays (Cluster.down)."""
        self.ns.stop()
        for what in ("kube-proxy", "kubelet", "containerd"):
            # Already dead with the node's PID namespace; this reaps and drops pidfiles.
            self.proc(what).stop(timeout=2)
        remove_cgroup_tree(self.info.cgroup_parent)

    def pids(self) -> dict[str, int | None]:
        return {"init": self.ns.init_proc.pid(),
                **{w: self.proc(w).pid() for w in ("containerd", "kubelet", "kube-proxy")}}


class NodeKubelet(Kubelet):
    """kubelet of a cluster node: run inside the node, paths as the node sees them."""

    def __init__(self, cp: ControlPlane, node: ClusterNode) -> None:
        super().__init__(cp, node, node_name=node.name, workdir=node.ns.path(KUBELET_DIR))
        self.cnode = node

    @property
    def address(self) -> str:
        return self.cnode.address

    @property
    def config_path(self) -> Path:
        return self.dir / "config.yaml"  # /var/lib/kubelet/config.yaml inside

    @property
    def root_dir(self) -> Path:
        return self.dir

    @property
    def pod_logs_dir(self) -> Path:
        return self.cnode.ns.path("/var/log/pods")

    @property
    def pod_subnet(self) -> str:
        return self.cnode.pod_cidr

    def proc(self) -> Proc:
        return self.cnode.proc("kubelet")

    def _inside(self, p: Path) -> str:
        return KUBELET_DIR + str(p)[len(str(self.dir)):]

    def config(self) -> dict[str, Any]:
        cfg = super().config()
        if has("default-KubeletEnsureSecretPulledImages"):
            # The add-on e2e installs the release's image by digest through a pull Secret,
            # and the tests' own pods run that image's content as an imported sleeper
            # (pull policy Never): kubelet would refuse them (ErrImageNeverPull) for an
            # image ID it pulled with credentials. Only here: on the single-node harness
            # it changed how a waiting pull shows (test_other_tenants_pulls_are_a_count
            # failed 2 of 3 with it, passed 3 of 3 without).
            cfg["imagePullCredentialsVerificationPolicy"] = "NeverVerify"
        sock = f"unix://{CRI_SOCKET}"
        cfg.update({
            # kubelet's default of 110 leaves a 200-replica rollout (test_rollout200:
            # ~100 per node beside the add-on's apiserver and agent pods) a few pods of
            # room: a spread a little uneven, or an earlier test's pods still
            # terminating, and replicas stay Pending (OutOfpods). The /24 pod CIDR has
            # 253 addresses for pods; a few stay spare for pods being torn down.
            "maxPods": MAX_PODS,
            "containerRuntimeEndpoint": sock, "imageServiceEndpoint": sock,
            "podLogsDir": "/var/log/pods",
            "tlsCertFile": self._inside(self.dir / "pki/kubelet.crt"),
            "tlsPrivateKeyFile": self._inside(self.dir / "pki/kubelet.key"),
            "volumePluginDir": self._inside(self.dir / "volume-plugins"),
        })
        return cfg

    def cni_config(self) -> dict[str, Any]:
        # The bridge lives in the node's netns; its gateway address is the pods' default
        # route. No masquerade: every node and the host route the pod CIDRs.
        gw = self.pod_subnet.rsplit(".", 1)[0] + ".1"
        return {"cniVersion": "1.0.0", "name": "aggapi-cluster", "plugins": [{
            "type": "bridge", "bridge": "cni0", "isGateway": True,
            "isDefaultGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local",
                     "ranges": [[{"subnet": self.pod_subnet, "gateway": gw}]],
                     "dataDir": "/var/lib/cni/networks"}}]}

    def prepare_host(self) -> None:
        pass  # sysctls are recorded once per cluster (tests.framework.cluster)

    def argv(self, kubelet_bin: str) -> list[str]:
        return [*self.cnode.ns.exec_prefix(), kubelet_bin,
                f"--config={KUBELET_DIR}/config.yaml",
                f"--kubeconfig={self._inside(self.kubeconfig_path)}",
                f"--root-dir={KUBELET_DIR}", f"--hostname-override={self.node_name}",
                f"--node-ip={self.address}", f"--v={self.verbosity}"]

    def stop(self, *, all_sandboxes: bool = False) -> None:
        self.proc().stop(timeout=20)


def save(node: ClusterNode) -> None:
    (node.dir / "node.json").write_text(json.dumps({
        "name": node.name, "address": node.address, "pod_cidr": node.pod_cidr,
        "netns": node.host.netns, "cri_address": node.cri_address,
        "cgroup_parent": node.info.cgroup_parent, "time": time.time()}, indent=2) + "\n")
