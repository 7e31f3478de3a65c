"""The control plane's layout: its names and ports, its state directory and the two netns
hosts (tests.framework.controlplane builds on this)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.framework.controllers import Controllers
from tests.framework.kubetools import binary
from tests.framework.netns import Host, Network
from tests.framework.procs import HarnessError, Proc, wait_ready
from tests.framework.repo import REPO

NAMESPACE = "aggapi"
APISERVER_SERVICE = "aggapi"
AGENT_SERVICE = "aggapi-agent"
APISERVER_SA = "aggapi-apiserver"
APISERVER_USER = f"system:serviceaccount:{NAMESPACE}:{APISERVER_SA}"
GROUP = "subresources.aggapi.io"
VERSION = "v1alpha1"
APISERVICE = f"{VERSION}.{GROUP}"
KUBE_PORT = 6443
AGGAPI_PORT = 8443
AGENT_PORT = 10443
# Dual-stack Service ranges, so charts rendered with ipFamilyPolicy RequireDualStack
# validate. ClusterIPs are never dialled here (no kube-proxy, aggregator routing).
SERVICE_CIDR = "10.0.0.0/24,fd00:aa:0:1::/112"
SERVICE_IPS = ["10.0.0.1"]
FRONT_PROXY_CN = "front-proxy-client"
# kube-apiserver's client cert towards kubelets (bound to system:kubelet-api-admin by
# tests.framework.kubelet, whose kubelets authorize it by SubjectAccessReview).
APISERVER_KUBELET_CLIENT_CN = "kube-apiserver-kubelet-client"
# The netns prefix is "agg" + the instance's first letter: keep first letters distinct.
# "parallel": a second e2e run beside another one (AGGAPI_E2E_INSTANCE=parallel).
INSTANCES = {"local": 0, "e2e": 1, "parallel": 3}


def log(msg: str) -> None:
    print(f"controlplane: {msg}", file=sys.stderr, flush=True)

@dataclass
class ControlPlaneLayout:
    instance: str = "local"
    node_name: str = "aggapi-node-1"
    state: Path = field(default=Path())
    net: Network = field(init=False)
    api_host: Host = field(init=False)
    node_host: Host = field(init=False)

    def __post_init__(self) -> None:
        if self.instance not in INSTANCES:
            raise HarnessError(f"instance must be one of {sorted(INSTANCES)}")
        if self.state == Path():
            base = os.environ.get("AGGAPI_CONTROLPLANE_DIR") or str(REPO / ".local/controlplane")
            self.state = Path(base) / self.instance
        self.net = Network(prefix=f"agg{self.instance[0]}-",
                           subnet=f"10.251.{INSTANCES[self.instance]}")
        self.api_host = self.net.host("api", 2)
        self.node_host = self.net.host("node", 3)

    # paths
    @property
    def pki_dir(self) -> Path:
        return self.state / "pki"

    @property
    def aggapi_certs(self) -> Path:
        return self.state / "pki/aggapi"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.state / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.net.host_address}:{KUBE_PORT}"

    def user_kubeconfig(self, user: str) -> Path:
        return self.state / "users" / f"{user}.kubeconfig"

    def proc(self, name: str) -> Proc:
        return Proc.named(self.state, name)

    def env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": str(self.admin_kubeconfig),
            "AGGAPI_KUBE_SERVER": self.server,
            "AGGAPI_STATE_DIR": str(self.state),
            "AGGAPI_CERTS": str(self.aggapi_certs),
            "AGGAPI_APISERVER_NETNS": self.api_host.netns,
            "AGGAPI_APISERVER_ADDRESS": self.api_host.address,
            "AGGAPI_AGENT_NETNS": self.node_host.netns,
            "AGGAPI_AGENT_ADDRESS": self.node_host.address,
            "AGGAPI_NODE_NAME": self.node_name,
            "AGGAPI_KUBECTL": binary("kubectl", build=False),
        }

    @property
    def controllers(self) -> Controllers:
        return Controllers(self.state, self.pki_dir, self.server)

    @staticmethod
    def _wait(ok: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
        wait_ready(ok, timeout, what, proc)
