"""One kubelet's names: ports, paths under its work dir, its node (tests.framework.kubelet
builds on this)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from tests.framework.controlplane import INSTANCES, ControlPlane
from tests.framework.nodestate import NodeInfo
from tests.framework.procs import Proc

KUBELET_PORT = 10250
HEALTHZ_PORT = 10248


def log(msg: str) -> None:
    print(f"kubelet: {msg}", file=sys.stderr, flush=True)


def pod_subnet(cp: ControlPlane) -> str:
    return f"10.251.{64 + INSTANCES[cp.instance]}.0/24"


class KubeletHost(Protocol):
    """What a kubelet needs of its node: tests.framework.node.Node, or a node of a
    multi-node cluster (tests.framework.clusternode)."""

    dir: Path
    info: NodeInfo

    @property
    def cri_address(self) -> str: ...



class KubeletLayout:
    def __init__(self, cp: ControlPlane, node: KubeletHost, *,
                 serialize_image_pulls: bool = True,
                 max_parallel_image_pulls: int | None = None,
                 extra_config: Mapping[str, Any] | None = None, verbosity: int = 2,
                 node_name: str | None = None, workdir: Path | None = None) -> None:
        self.cp = cp
        self.node = node
        self.node_name = node_name or cp.node_name
        self.serialize_image_pulls = serialize_image_pulls
        self.max_parallel_image_pulls = max_parallel_image_pulls
        self.extra_config = dict(extra_config or {})
        self.verbosity = verbosity
        self.dir = workdir or cp.state / "kubelet"
        self._sysctls: dict[str, str] = {}
        self._prev_config: str | None = None  # the node's kubelet.yaml before ours

    # --- names -------------------------------------------------------------------------
    @property
    def address(self) -> str:
        return self.cp.net.host_address

    @property
    def config_path(self) -> Path:
        """The file the aggapi agent reads: the node's kubelet.yaml."""
        return self.node.dir / "kubelet.yaml"

    @property
    def root_dir(self) -> Path:
        return self.dir / "root"

    @property
    def pod_logs_dir(self) -> Path:
        return self.dir / "pod-logs"

    @property
    def kubeconfig_path(self) -> Path:
        return self.dir / "kubelet.kubeconfig"

    @property
    def cni_bridge(self) -> str:
        return f"agg{self.cp.instance[0]}-cni0"

    @property
    def cni_conf(self) -> Path:
        return Path(self.node.info.containerd_dir) / "cni/net.d/10-aggapi.conflist"

    @property
    def pod_subnet(self) -> str:
        return pod_subnet(self.cp)

    def proc(self) -> Proc:
        return self.cp.proc("kubelet")
