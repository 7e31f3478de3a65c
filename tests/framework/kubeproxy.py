"""kube-proxy (the pin or AGGAPI_KUBE_VERSION) of a cluster node, in iptables mode.

It runs inside the node's namespaces (tests.framework.nodens) and programs the iptables
(nf_tables backend) of the node's network namespace: pods' traffic to ClusterIPs is
DNATed there, before it leaves the node. Its identity is a cluster-CA client cert for
``system:kube-proxy`` (bound to ``system:node-proxier`` by kube-apiserver's bootstrap
RBAC). Flags rather than a config file, and why:

    --proxy-mode=iptables
    --cluster-cidr              the cluster's pod CIDR: traffic from elsewhere to a
                                ClusterIP is masqueraded (--detect-local-mode ClusterCIDR)
    --conntrack-max-per-core=0  leave nf_conntrack_max alone: it is the host's, not
    --conntrack-tcp-timeout-*=0 per-namespace, and this VM is shared
    --healthz-bind-address      the node's address:10256 (the harness polls /healthz)
    --metrics-bind-address      127.0.0.1:10249 of the node's netns

No conntrack binary is needed: v1.34 clears stale UDP entries over netlink.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aggapi.tls import pki
from tests.framework.controlplane import ControlPlane
from tests.framework.kubetools import binary, kubeconfig
from tests.framework.procs import Proc, spawn, wait_ready

USER = "system:kube-proxy"
HEALTHZ_PORT = 10256


@dataclass
class KubeProxy:
    cp: ControlPlane
    node_name: str
    address: str       # the node's InternalIP
    cluster_cidr: str
    workdir: Path
    proc: Proc

    @property
    def kubeconfig_path(self) -> Path:
        return self.workdir / "kube-proxy.kubeconfig"

    def write_pki(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.kubeconfig_path.exists():
            return
        ca = pki.load_pair(self.cp.pki_dir / "ca.crt", self.cp.pki_dir / "ca.key")
        kp = pki.issue(ca, USER, client=True)
        pki.write_file(self.kubeconfig_path, kubeconfig(
            self.cp.server, ca.cert_pem, kp.cert_pem, kp.key_pem, USER).encode(), mode=0o600)

    def argv(self) -> list[str]:
        return [binary("kube-proxy"), f"--kubeconfig={self.kubeconfig_path}",
                f"--hostname-override={self.node_name}", f"--bind-address={self.address}",
                "--proxy-mode=iptables", f"--cluster-cidr={self.cluster_cidr}",
                "--detect-local-mode=ClusterCIDR",
                # The node's own address: what `primary` means, which v1.30.4 refuses (CIDRs only).
                f"--nodeport-addresses={self.address}/32",
                "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                f"--healthz-bind-address={self.address}:{HEALTHZ_PORT}",
                "--metrics-bind-address=127.0.0.1:10249", "--v=1"]

    def start(self, prefix: Sequence[str]) -> None:
        """Start it with ``prefix`` (the node's nsenter), not waiting: see :meth:`healthy`."""
        self.write_pki()
        spawn(self.proc.name, [*prefix, *self.argv()], self.proc.pidfile.parent.parent)

    def healthy(self) -> bool:
        """/healthz is 200 once its rules are synced (and kept in sync)."""
        try:
            url = f"http://{self.address}:{HEALTHZ_PORT}/healthz"
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status) == 200
        except (urllib.error.URLError, OSError):
            return False

    def wait(self, timeout: float = 60.0, ok: Callable[[], bool] | None = None) -> None:
        wait_ready(ok or self.healthy, timeout, f"kube-proxy of {self.node_name}", self.proc)
