"""kube-apiserver's side of a kubelet: its client cert and --kubelet-* flags towards
kubelets, and the RBAC kubelets need."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aggapi.tls import pki
from tests.framework.controlplane import APISERVER_KUBELET_CLIENT_CN, ControlPlane
from tests.framework.kubeletlayout import KubeletLayout, log
from tests.framework.kubeletpods import HARNESS_LABEL
from tests.framework.procs import spawn


def apiserver_kubelet_client_paths(cp: ControlPlane) -> tuple[Path, Path]:
    return cp.pki_dir / "apiserver-kubelet-client.crt", cp.pki_dir / "apiserver-kubelet-client.key"


def apiserver_flags(cp: ControlPlane) -> list[str]:
    """kube-apiserver flags for talking to kubelet (exec, attach, port-forward, logs, cp):
    ControlPlane.kubelet_client_flags, which the control plane passes from the start."""
    return cp.kubelet_client_flags()


def ensure_apiserver_client_cert(cp: ControlPlane) -> None:
    crt, key = apiserver_kubelet_client_paths(cp)
    if crt.exists() and key.exists():
        return
    ca = pki.load_pair(cp.pki_dir / "ca.crt", cp.pki_dir / "ca.key")
    pki.issue(ca, APISERVER_KUBELET_CLIENT_CN, client=True).write(crt, key)


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []



class KubeletAPIServerSide(KubeletLayout):
    def ensure_apiserver(self) -> bool:
        """Restart kube-apiserver with :func:`apiserver_flags` unless it runs with them.

        Returns True if it restarted. A no-op once controlplane.py passes the flags."""
        ensure_apiserver_client_cert(self.cp)
        proc = self.cp.proc("kube-apiserver")
        pid = proc.pid()
        args = _cmdline(pid) if pid else []
        names = {f.split("=", 1)[0] for f in apiserver_flags(self.cp)}
        if args and names <= {a.split("=", 1)[0] for a in args}:
            return False
        log("restarting kube-apiserver with the --kubelet-* flags")
        proc.stop()
        argv = [a for a in self.cp.kube_apiserver_args() if a.split("=", 1)[0] not in names]
        p = spawn("kube-apiserver", [*argv, *apiserver_flags(self.cp)], self.cp.state)
        self.cp._wait(self.cp.readyz, 120, "kube-apiserver /readyz", p)
        return True

    def rbac(self) -> list[dict[str, Any]]:
        # kube-root-ca.crt (every pod's projected service-account volume reads it) is
        # published by kube-controller-manager (tests.framework.controllers).
        def crb(name: str, role: str, user: str) -> dict[str, Any]:
            return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": name, "labels": {HARNESS_LABEL: "kubelet"}},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                "name": role},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                  "name": user}]}

        return [
            # kube-apiserver -> kubelet: nodes/proxy, nodes/log, ... (kubelet's SAR).
            crb("aggapi-harness:apiserver-kubelet-client", "system:kubelet-api-admin",
                APISERVER_KUBELET_CLIENT_CN),
            # kubelet's authentication/authorization webhooks: TokenReview + SAR.
            crb("aggapi-harness:kubelet-auth-delegator", "system:auth-delegator",
                f"system:node:{self.node_name}"),
        ]
