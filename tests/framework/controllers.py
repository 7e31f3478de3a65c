"""kube-controller-manager and kube-scheduler beside the harness's kube-apiserver.

Both are the real commands of the release under test (the pin or AGGAPI_KUBE_VERSION;
hack/build-binaries.sh, the same k8s.io/kubernetes module as kube-apiserver), started
once per control plane:

    kube-controller-manager  https://127.0.0.1:<free port>, user system:kube-controller-manager
                             (cluster-CA client cert), --use-service-account-credentials:
                             each controller acts as its own ServiceAccount in kube-system,
                             with tokens from the TokenRequest API (kube-apiserver's
                             --service-account-signing-key-file, sa.key here too)
    kube-scheduler           https://127.0.0.1:<free port>, user system:kube-scheduler

The bootstrap RBAC of kube-apiserver already binds both users. Leader election is off
(one of each). Logs in ``<state>/logs/``, pidfiles in ``<state>/pids/``, kubeconfigs and
serving certs in ``<state>/controllers/``.

What runs, and what cannot here (``DISABLED``):
- cloud-node-lifecycle-controller, node-route-controller, service-lb-controller: there is
  no cloud provider. kube-controller-manager 1.37 no longer has them (it refuses their
  names): they are turned off only on older releases.
- node-lifecycle-controller runs (it lifts the ``node.kubernetes.io/not-ready`` NoSchedule
  taint kubelet puts on its Node, so kube-scheduler can place pods there), with a node
  monitor grace period of an hour: the harness node is often served by the kubelet
  stand-in (tests.framework.standin), which renews no Lease, and with the default 40 s
  the controller would mark the node unreachable and evict the stand-in's pods.
Everything else runs: deployment/replicaset, garbage collector, namespace, serviceaccount
(the ``default`` ServiceAccounts), root-ca-certificate-publisher (``kube-root-ca.crt`` in
every namespace), endpointslice, clusterrole-aggregation, ...
"""

from __future__ import annotations

import functools
import ssl
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from aggapi.tls import pki
from tests.framework.kubetools import binary, has, kubeconfig
from tests.framework.procs import Proc, free_port, spawn, wait_ready

KCM = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
PROCS = (SCHEDULER, KCM)
DISABLED = ("cloud-node-lifecycle-controller", "node-route-controller", "service-lb-controller")


def disabled() -> tuple[str, ...]:
    """What to turn off on the release under test (1.37 dropped the cloud controllers)."""
    return () if has("kcm-without-cloud-controllers") else DISABLED


# Longer than a test session: see the module's docstring.
NODE_MONITOR_GRACE = "1h"


@dataclass
class Controllers:
    """Start/stop kube-controller-manager and kube-scheduler for one control plane."""

    state: Path     # the control plane's state directory
    pki_dir: Path   # its cluster CA (ca.crt/key) and service-account key (sa.key)
    server: str     # kube-apiserver's URL

    @property
    def dir(self) -> Path:
        return self.state / "controllers"

    def proc(self, name: str) -> Proc:
        return Proc.named(self.state, name)

    def _kubeconfig(self, name: str) -> Path:
        """A client cert of the cluster CA for ``system:<name>`` and its kubeconfig."""
        path = self.dir / f"{name}.kubeconfig"
        if path.exists():
            return path
        ca = pki.load_pair(self.pki_dir / "ca.crt", self.pki_dir / "ca.key")
        user = f"system:{name}"
        kp = pki.issue(ca, user, client=True)
        pki.write_file(path, kubeconfig(self.server, ca.cert_pem, kp.cert_pem, kp.key_pem,
                                        user).encode(), mode=0o600)
        return path

    def _common(self, name: str, port: int) -> list[str]:
        kc = self._kubeconfig(name)
        return [f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                f"--authorization-kubeconfig={kc}", "--leader-elect=false",
                "--bind-address=127.0.0.1", f"--secure-port={port}",
                f"--cert-dir={self.dir / (name + '-certs')}", "--profiling=false", "--v=1"]

    def kcm_args(self, port: int) -> list[str]:
        ca = self.pki_dir
        return [binary(KCM), *self._common(KCM, port),
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={ca / 'sa.key'}",
                f"--root-ca-file={ca / 'ca.crt'}",
                # CSRs (a kubelet's serving cert, say) are signed by the cluster CA.
                f"--cluster-signing-cert-file={ca / 'ca.crt'}",
                f"--cluster-signing-key-file={ca / 'ca.key'}",
                "--controllers=" + ",".join(["*", *(f"-{c}" for c in disabled())]),
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                "--allocate-node-cidrs=false"]  # the harness gives each node its pod range

    def scheduler_args(self, port: int) -> list[str]:
        return [binary(SCHEDULER), *self._common(SCHEDULER, port)]

    def start(self, *, wait: float = 90.0) -> float:
        """Start whichever is not running; wait until both answer /healthz. Seconds taken."""
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        started: list[tuple[Proc, int]] = []
        for name, args in ((KCM, self.kcm_args), (SCHEDULER, self.scheduler_args)):
            p = self.proc(name)
            port_file = self.dir / f"{name}.port"
            if not p.alive():
                port = free_port()
                p = spawn(name, args(port), self.state)
                port_file.write_text(f"{port}\n")
            started.append((p, int(port_file.read_text())))
        if wait:
            for p, port in started:
                wait_ready(functools.partial(_healthz, port), wait, f"{p.name} /healthz", p)
        return time.monotonic() - t0

    def stop(self) -> None:
        for name in PROCS:
            self.proc(name).stop()


def _healthz(port: int) -> bool:
    # Their serving certs are self-signed (--cert-dir): only liveness is checked here.
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=ctx,
                                    timeout=2) as r:
            return int(r.status) == 200
    except OSError:
        return False
