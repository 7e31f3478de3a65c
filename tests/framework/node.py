"""The node side of the local harness: containerd + runc, a registry behind a throttle
proxy, the test images, and ``aggapi agent`` in the node's network namespace.

Reusable by anything that runs pods on the harness node: the kubelet stand-in
(tests.framework.standin), the demo (tests.framework.demo), the e2e fixtures, and later a
real kubelet (point it at :attr:`Node.cri_address`). Nothing here creates Kubernetes
objects or pods.

Every process is started in its own session with a pidfile in the control plane's
``pids/`` directory (``pid starttime``), so ``Node.load(cp).stop()`` from another process
(``hack/local-down.sh``) stops exactly what was started, by PID. Layout, all under
``<control plane state>/node/``:

    node.json           what ``load`` needs: hosts, addresses, cgroup parent, images
    registry/           docker-registry storage and config (10.251.N.1:<free port>)
    authregistry/       a second one with htpasswd auth (bcrypt), for releases
                        (hack/release.sh): nodes pull from it with an imagePullSecret
    throttle.json       the throttle proxy's rate (its process applies changes, acks)
    containerd/         containerd root, state, socket, config, certs.d (hosts.toml)
    pods/               container logs of the pods run through CRI
    inflight/           the agent's --copy-state-dir
    kubelet.yaml        the agent's --kubelet-config (image-pull limits)

containerd runs in the host network namespace and the agent reaches its unix socket by
path from the node namespace. The registry and the throttle proxy listen on the host bridge
address 10.251.N.1 (not 127.0.0.1): the containerd of every node of a multi-node cluster
(tests.framework.cluster), each in a network namespace of its own, pulls from them too.
Built layers are cached in ``<repo>/.local/oci-cache`` (the ~150 MB random layers are
built once).
What is on disk, and the teardown from there, is tests.framework.nodestate.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tests.framework import nodestate
from tests.framework.containerd import Containerd
from tests.framework.controlplane import ControlPlane
from tests.framework.nodelayout import (  # noqa: F401
    BIG_LAYER,
    NEEDED,
    OCI_CACHE,
    REGISTRY_BIN,
    Images,
    MiB,
    ensure_runtime_deps,
    log,
)
from tests.framework.noderegistry import NodeRegistry
from tests.framework.nodestate import NodeInfo
from tests.framework.nodethrottle import NodeThrottle, _serve_throttle, throttle_for  # noqa: F401
from tests.framework.procs import Proc


# The names and node.json are NodeLayout's (nodelayout.py), the registries and test images
# NodeRegistry's (noderegistry.py), the throttle proxy NodeThrottle's (nodethrottle.py).
class Node(NodeRegistry, NodeThrottle):
    """One harness node: start()/stop() in-process, or load() what another process started."""

    # --- lifecycle -------------------------------------------------------------------
    def start(self, *, agent: bool = True, agent_extra: tuple[str, ...] = ()) -> float:
        """Registry, images, throttle proxy, containerd, then the agent. Returns seconds."""
        t0 = time.monotonic()
        ensure_runtime_deps()
        self.stop()  # leftovers of an interrupted run, by their pidfiles
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_registry()
            self._push_images()
            self._start_throttle()
            self._start_auth_registry()
            self._start_containerd()
            if agent:
                self.start_agent(extra=agent_extra)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - t0

    def start_agent(self, *, extra: tuple[str, ...] = (), wait: float = 30.0) -> Proc:
        kubelet = self.dir / "kubelet.yaml"
        if not kubelet.exists():
            # The stand-in pulls images in parallel, as kubelet with this config does.
            kubelet.write_text("apiVersion: kubelet.config.k8s.io/v1beta1\n"
                               "kind: KubeletConfiguration\nserializeImagePulls: false\n")
        return self.cp.start_agent(
            cri_socket=self.cri_address, containerd_socket=self.cri_address,
            kubelet_config=str(kubelet), wait=wait,
            extra=[f"--copy-state-dir={self.dir / 'inflight'}", *extra])

    def stop_agent(self) -> None:
        self.cp.proc(nodestate.AGENT_PROC).stop()

    def stop(self) -> None:
        """Stop the agent, containerd (and clean up its containers, shims, mounts and
        cgroups), the throttle proxy and the registry; remove the node directory."""
        nodestate.teardown(self.cp.state, info=self.info, containerd=self.containerd)
        self.containerd = None
        self.info = NodeInfo()

    @classmethod
    def load(cls, cp: ControlPlane) -> Node:
        """The node another process started (from node.json)."""
        node = cls(cp)
        node.info = nodestate.load_info(cp.state)
        return node

    def running(self) -> dict[str, int | None]:
        return {n: self.proc(n).pid() for n in nodestate.NODE_PROCS} | {
            nodestate.AGENT_PROC: self.cp.proc(nodestate.AGENT_PROC).pid()}

    # --- registry --------------------------------------------------------------------
    # --- containerd ------------------------------------------------------------------
    def _start_containerd(self) -> None:
        if self.proc("containerd").alive() and self.info.containerd_dir:
            return
        (self.dir / "containerd").mkdir(parents=True, exist_ok=True)
        ctd = Containerd(self.dir / "containerd", sandbox_image=self.info.sandbox_image)
        # A name tied to the instance, so a crashed run's cgroups are recognisable.
        ctd.cgroup_parent = f"/aggapi-{self.cp.instance}-{os.urandom(3).hex()}"
        for host in self.info.registry_hosts():
            ctd.add_registry(host)
        self.containerd = ctd
        self.info.containerd_dir = str(ctd.workdir)
        self.info.cgroup_parent = ctd.cgroup_parent
        self.info.snapshotter = ctd.snapshotter
        self._save()
        try:
            ctd.start()
        finally:
            if ctd.proc is not None:
                self.proc("containerd").record(ctd.proc.pid)


def ensure_node(cp: ControlPlane) -> Node:
    """The node of ``cp``, running with its agent: the one started earlier (by any
    process) if its processes are alive, else a fresh one."""
    if nodestate.has_node(cp.state):
        node = Node.load(cp)
        if all(node.proc(n).alive() for n in nodestate.NODE_PROCS):
            node.start_agent()
            return node
        log("node state found but processes are gone: restarting the node")
        node.stop()
    node = Node(cp)
    took = node.start()
    log(f"node up in {took:.1f}s: containerd {node.cri_address}, registry "
        f"{node.info.registry_host}, throttle proxy {node.info.throttle_host}, agent "
        f"{cp.node_host.address} (netns {cp.node_host.netns})")
    return node



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.node", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("throttle", help="run the throttle proxy (started by Node.start)")
    t.add_argument("--upstream", required=True)
    t.add_argument("--port", type=int, required=True)
    t.add_argument("--control", type=Path, required=True)
    t.add_argument("--bind", default="127.0.0.1")
    for name in ("up", "down", "status"):
        s = sub.add_parser(name, help=f"{name} the node of a running control plane")
        s.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    a = p.parse_args(argv)
    if a.command == "throttle":
        _serve_throttle(a.upstream, a.port, a.control, a.bind)
        return 0
    cp = ControlPlane(instance=a.instance)
    if a.command == "up":
        node = Node(cp)
        took = node.start()
        log(f"node up in {took:.1f}s: containerd {node.cri_address}, "
            f"registry {node.info.registry_host}, throttle {node.info.throttle_host}")
    elif a.command == "down":
        if nodestate.has_node(cp.state):
            Node.load(cp).stop()
    else:
        print(json.dumps(Node.load(cp).running(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
