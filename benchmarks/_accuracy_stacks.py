"""Where bench_progress_accuracy pulls: the host-process harness (one node, a real
kubelet) or the helm-installed add-on on the two-node cluster, each with the one
throttle the bench reads its truth from.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks._accuracy_scenarios import HOST_PATH, Scenario
from tests.framework import nodestate
from tests.framework.addon import CHECKOUT_ARCHIVE, Addon, addon_of, build_image, running_cluster
from tests.framework.cluster import Cluster, registry_of
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.node import Node, throttle_for
from tests.framework.procs import HarnessError, Proc
from tests.framework.repo import REPO
from tests.framework.throttle import ThrottleProxy

# The leader tells nodes on one link their peers' pulls (--link-peers, issue 37 item 3).
LINK_PEERS = ["apiserver.linkPeers=true"]


def log(msg: str) -> None:
    print(f"bench_progress_accuracy: {msg}", file=sys.stderr, flush=True)


def running_containerd() -> str:
    return "1.6" if os.environ.get("AGGAPI_CONTAINERD", "").startswith("1.6") else "2.x"


@dataclass
class Stack:
    """The host-process harness: one node (host containerd), a real kubelet, the aggapi
    apiserver and agent as host processes."""

    cp: ControlPlane
    up: bool
    node: Node | None = None
    kubelet: Kubelet | None = None
    containerd: str = ""
    started: list[Proc] = field(default_factory=list)
    path: str = HOST_PATH

    def bring_up(self, containerd: str) -> None:
        """Control plane (once), node with this containerd, real kubelet, aggapi."""
        if containerd == self.containerd:
            return
        if self.node is not None:
            self.take_down_node()
        os.environ["AGGAPI_CONTAINERD"] = containerd
        if not self.cp.proc("kube-apiserver").alive():
            subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "etcd", "kubectl",
                            "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                            "kubelet"], check=True, stdout=subprocess.DEVNULL)
            log(f"control plane up in {self.cp.up():.1f}s")
        self.node = Node(self.cp)
        log(f"node (containerd {containerd}) up in {self.node.start(agent=False):.1f}s")
        # kubelet before the agent: the agent reads the kubelet's config file.
        self.kubelet = Kubelet(self.cp, self.node)
        log(f"kubelet Ready in {self.kubelet.start():.1f}s")
        self.cp.start_apiserver()
        self.node.start_agent()
        self.containerd = containerd

    def take_down_node(self) -> None:
        assert self.node is not None
        self.node.stop_agent()
        if self.kubelet is not None:
            if self.kubelet.proc().alive():
                self.kubelet.delete_pods()
            self.kubelet.stop(all_sandboxes=True)
        self.node.stop()
        self.node = self.kubelet = None
        self.containerd = ""

    def attach(self) -> None:
        """The instance's running stack (no --up)."""
        if not nodestate.has_node(self.cp.state):
            raise SystemExit("no running node on this instance: hack/local-up.sh or --up")
        self.node = Node.load(self.cp)
        self.kubelet = Kubelet(self.cp, self.node)
        if not self.kubelet.proc().alive():
            raise SystemExit("no kubelet running on this instance: hack/local-up.sh or --up")
        self.containerd = running_containerd()

    def down(self) -> None:
        if self.node is not None:
            with contextlib.suppress(Exception):
                self.take_down_node()
        self.cp.down()

    # --- what a scenario needs (ClusterStack has the same) ------------------------------
    def cannot_run(self, sc: Scenario) -> str | None:
        if sc.nodes > 1:
            return "needs --cluster"
        if not self.up and sc.containerd != self.containerd:
            return f"containerd {sc.containerd} not running"
        return None

    def prepare(self, sc: Scenario) -> None:
        if self.up:
            self.bring_up(sc.containerd)

    @property
    def registry(self) -> Node:
        assert self.node is not None
        return self.node

    def placement(self, sc: Scenario) -> list[tuple[str, str]]:
        """Each pod's node: (Node name, its containerd's CRI address)."""
        assert self.node is not None
        return [(self.node.name, self.node.cri_address)] * sc.pods

    def link(self, rate: int) -> contextlib.AbstractContextManager[ThrottleProxy]:
        """A throttle of this process's own in front of the node's registry (so its record
        is readable here), on the host bridge address."""
        assert self.node is not None
        return self.node.own_throttle(rate, bind=self.node.bind)

    @contextlib.contextmanager
    def pulling_at_once(self, sc: Scenario) -> Iterator[None]:
        """Several pods share the link only if kubelet pulls their images at once."""
        kubelet = self.kubelet
        assert kubelet is not None
        serial = sc.pods > 1 and kubelet.serialize_image_pulls
        if serial:
            kubelet.restart(serialize_image_pulls=False)
        try:
            yield
        finally:
            if serial:
                kubelet.restart(serialize_image_pulls=True)


@dataclass
class ClusterStack:
    """The two-node cluster of hack/local-up.sh (tests.framework.cluster) with aggapi
    installed by helm (tests.framework.addon): the agents are DaemonSet pods from this
    checkout's image, the aggapi apiserver a Deployment. One throttle of the bench's own,
    on the host bridge address every node's netns routes to, trusted by both nodes'
    containerd: pods on both nodes share its link."""

    cp: ControlPlane
    up: bool
    cluster: Cluster | None = None
    addon: Addon | None = None
    containerd: str = "2.x"  # what tests.framework.cluster runs
    brought: list[str] = field(default_factory=list)  # what bring_up started, to take down
    path: str = ""

    def bring_up(self) -> None:
        """As hack/local-up.sh: control plane and two nodes, this checkout's image, helm
        install; whatever already runs is used as it is."""
        subprocess.run(["bash", str(REPO / "hack/build-binaries.sh"), "etcd", "kubectl",
                        "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                        "kubelet", "kube-proxy", "helm"], check=True,
                       stdout=subprocess.DEVNULL)
        if not self.cp.proc("kube-apiserver").alive():
            self.brought.append("control plane")
            log(f"control plane up in {self.cp.up():.1f}s")
        if not nodestate.has_node(self.cp.state):
            self.brought.append("registry")
        cluster = self.cluster = Cluster(self.cp, registry_of(self.cp))
        if not cluster_ready(cluster):
            self.brought.append("cluster")
            log(f"{len(cluster.nodes)} nodes Ready in {cluster.up():.1f}s")
        addon = self.addon = addon_of(cluster)
        if addon.installed():
            log("add-on already installed: used as it is")
        else:
            log(f"image built or up to date in {build_image():.1f}s")
            log(f"image loaded in {addon.load_image(CHECKOUT_ARCHIVE):.1f}s")
            addon.remove_harness_objects()
            self.brought.append("add-on")
            log(addon.install(LINK_PEERS).line())
        self._describe()

    def attach(self) -> None:
        """The instance's running cluster and add-on (hack/local-up.sh; no --up)."""
        try:
            cluster = self.cluster = running_cluster(self.cp.instance)
        except HarnessError as err:
            raise SystemExit(f"{err} (or --up)") from err
        if not cluster_ready(cluster):
            raise SystemExit("the two-node cluster is not Ready: hack/local-up.sh or --up")
        addon = self.addon = addon_of(cluster)
        if not addon.installed() or not addon.available():
            raise SystemExit("no helm-installed aggapi serving: hack/local-up.sh or --up")
        self._describe()

    def _describe(self) -> None:
        assert self.cluster is not None and self.addon is not None
        self.path = (f"helm-installed add-on ({self.addon.image}), "
                     f"{len(self.cluster.nodes)} nodes")

    def down(self) -> None:
        """Only what bring_up started: the control plane takes everything along."""
        if "control plane" in self.brought:
            self.cp.down()
            return
        if "add-on" in self.brought and self.addon is not None:
            with contextlib.suppress(Exception):
                self.addon.uninstall()
        if "cluster" in self.brought and self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.down()
        if "registry" in self.brought and self.cluster is not None:
            self.cluster.registry.stop()

    def cannot_run(self, sc: Scenario) -> str | None:
        if sc.containerd != self.containerd:
            return f"the cluster runs containerd {self.containerd}"
        n = len(self.cluster.nodes) if self.cluster is not None else 2
        if sc.nodes > n or sc.pods > sc.nodes:
            # Two pods on one node pull at once only with serializeImagePulls false: a
            # kubelet restart this path does not make.
            return f"one pod per node, {n} nodes"
        return None

    def prepare(self, sc: Scenario) -> None:
        pass

    @property
    def registry(self) -> Node:
        assert self.cluster is not None
        return self.cluster.registry

    def placement(self, sc: Scenario) -> list[tuple[str, str]]:
        assert self.cluster is not None
        nodes = [self.cluster.nodes[k % sc.nodes] for k in range(sc.pods)]
        return [(n.name, n.cri_address) for n in nodes]

    def link(self, rate: int) -> contextlib.AbstractContextManager[ThrottleProxy]:
        assert self.cluster is not None
        reg = self.registry
        return throttle_for(reg.info.registry_host,
                            [Path(n.info.containerd_dir) for n in self.cluster.nodes], rate,
                            bind=reg.bind)

    def pulling_at_once(self, sc: Scenario) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # one pod per node: each kubelet pulls one image

    def server_logs(self) -> str:
        """Every aggapi apiserver replica's log so far, timestamped (the leader's link
        judgements are INFO lines of aggapi.apiserver.collections.linkshare)."""
        assert self.addon is not None
        out = []
        for p in self.addon.pods("apiserver"):
            name = p["metadata"]["name"]
            r = self.addon.kubectl("-n", self.addon.namespace, "logs", name, "--timestamps",
                                   check=False)
            out.append(f"--- {name}\n{r.stdout}{r.stderr}")
        return "\n".join(out)


def cluster_ready(cluster: Cluster) -> bool:
    """Every node's kubelet running and Ready, every kube-proxy synced (as local-up asks)."""
    return all(n.kubelet.proc().alive() and n.ready() and n.kube_proxy.healthy()
               for n in cluster.nodes)
