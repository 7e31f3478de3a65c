"""A real control plane on this machine: etcd + kube-apiserver, aggapi's objects, netns hosts.

Used by ``hack/local-up.sh`` (``python3 -m tests.framework.controlplane up|down|env|status``)
and by the e2e fixtures in ``tests/e2e/conftest.py``.

Layout (instance ``local`` uses 10.251.0.0/24, ``e2e`` 10.251.1.0/24; all state lives in
``<repo>/.local/controlplane/<instance>/``, which ``down`` removes):

    etcd            127.0.0.1:<free ports>, data in state/etcd
    kube-apiserver  https://10.251.N.1:6443 on the host bridge (the namespaces must reach it)
    aggapi          netns <p>api  10.251.N.2:8443   Service aggapi/aggapi + EndpointSlice
    aggapi agent    netns <p>node 10.251.N.3:10443  Service aggapi/aggapi-agent + EndpointSlice
                                                    with nodeName = the Node object
    APIService v1alpha1.subresources.aggapi.io -> aggapi/aggapi:443, caBundle = aggapi's CA

Finding (kube-apiserver v1.34, tested by ``loopback_endpoints_rejected``): an
EndpointSlice or Endpoints address 127.0.0.1 is refused ("may not be in the loopback
range"), hence the network namespaces (see tests/framework/netns.py).

Identity of the local aggapi apiserver: a client certificate (cluster CA) for user
``system:serviceaccount:aggapi:aggapi-apiserver`` with the service-account groups. RBAC
ServiceAccount subjects match that user name, so the shipped bindings apply unchanged.
Pods get real ServiceAccount tokens (kubelet's projected volume, TokenRequest).

RBAC: the shipped manifests/base/{serviceaccounts,rbac-apiserver,rbac-aggregated}.yaml,
then hack/local/rbac.yaml (e2e users alice and mallory, kubeconfigs in users/).
Authentication: client certs of the cluster CA; anonymous only for /livez, /readyz and
/healthz (AuthenticationConfiguration), so any other unauthenticated request is a 401.
kube-controller-manager and kube-scheduler run (tests.framework.controllers): the
``default`` ServiceAccounts, ``kube-root-ca.crt``, ReplicaSets, pods of Deployments,
EndpointSlices of Services with a selector and the aggregated view/edit/admin ClusterRoles
are theirs. The harness still creates the Node (status Ready: often only the kubelet
stand-in serves it) and the EndpointSlices of aggapi's two Services, whose backends run as
host processes outside any pod (a Service without a selector is how Kubernetes points at
such backends). kubelet and kube-proxy belong to the node (tests.framework.kubelet).
containerd, the registry and the demo are not started here (tests.framework.* fixtures).

Every process is started in its own session with a pidfile (pid + start time) and is
stopped by that PID only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from typing import Any

from tests.framework import nodens, nodestate
from tests.framework.aggapiprocs import AggapiProcesses, supported_flags  # noqa: F401
from tests.framework.controllers import PROCS as CONTROLLER_PROCS

# Re-exported: the harness's users import these from here.
from tests.framework.cplayout import (  # noqa: F401
    AGENT_PORT,
    AGENT_SERVICE,
    AGGAPI_PORT,
    APISERVER_KUBELET_CLIENT_CN,
    APISERVER_SA,
    APISERVER_SERVICE,
    APISERVER_USER,
    APISERVICE,
    FRONT_PROXY_CN,
    GROUP,
    INSTANCES,
    KUBE_PORT,
    NAMESPACE,
    SERVICE_CIDR,
    SERVICE_IPS,
    VERSION,
    log,
)
from tests.framework.cpobjects import Bootstrap
from tests.framework.cppki import DEFAULT_USERS, ClusterPKI  # noqa: F401
from tests.framework.kubeapiserver import EtcdAndKubeAPIServer
from tests.framework.kubetools import binary, feature_gates, has, kubeconfig, versions  # noqa: F401


# The concerns live in their modules (cplayout, cpaccess, cppki, kubeapiserver, cpobjects,
# aggapiprocs); the dataclass fields and __init__ are ControlPlaneLayout's.
class ControlPlane(ClusterPKI, EtcdAndKubeAPIServer, Bootstrap, AggapiProcesses):
    # --- lifecycle -------------------------------------------------------------------------
    def up(self) -> float:
        t0 = time.monotonic()
        self.state.mkdir(parents=True, exist_ok=True)
        for h in (self.api_host, self.node_host):
            self.net.add(h)
        self.generate_pki()
        self.start_etcd()
        self.start_kube_apiserver()
        self.controllers.start()
        self.bootstrap()
        took = time.monotonic() - t0
        (self.state / "info.json").write_text(json.dumps(
            {**self.env(), "up_seconds": round(took, 2)}, indent=2) + "\n")
        return took

    PROCS = (nodestate.AGENT_PROC, "aggapi-apiserver", *CONTROLLER_PROCS, "kube-apiserver",
             "etcd")

    def stop_aggapi(self) -> None:
        for name in (nodestate.AGENT_PROC, "aggapi-apiserver"):
            self.proc(name).stop()

    def down(self, *, keep_state: bool = False) -> None:
        if nodestate.has_node(self.state):
            # containerd's containers, shims, mounts and cgroups (tests.framework.node).
            try:
                nodestate.teardown(self.state)
            except Exception as err:  # the processes below are stopped regardless
                log(f"node cleanup: {err}")
        # The nodes of a multi-node cluster (tests.framework.cluster), by their inits' PIDs.
        nodens.teardown_all(self.state, self.net)
        pids = self.state / "pids"
        names = [*self.PROCS]
        if pids.is_dir():  # plus anything else started through spawn() in this state dir
            names += [p.stem for p in pids.glob("*.pid") if p.stem not in names]
        for name in names:
            self.proc(name).stop()
        self.net.teardown([self.api_host, self.node_host])
        if not keep_state and self.state.exists():
            shutil.rmtree(self.state)

    def status(self) -> dict[str, Any]:
        return {
            "state": str(self.state),
            "processes": {n: self.proc(n).pid() for n in self.PROCS},
            "kube-apiserver ready": self.readyz() if self.proc("kube-apiserver").alive() else False,
            "APIService available": self.apiservice_available()
            if self.proc("kube-apiserver").alive() else False,
        }


def loopback_endpoints_rejected(cp: ControlPlane) -> dict[str, str]:
    """Try 127.0.0.1 in an Endpoints and an EndpointSlice; return kind -> error ("" = accepted)."""
    ns = "default"
    out: dict[str, str] = {}
    for kind, obj in {
        "Endpoints": {"apiVersion": "v1", "kind": "Endpoints",
                      "metadata": {"name": "loopback-probe", "namespace": ns},
                      "subsets": [{"addresses": [{"ip": "127.0.0.1"}], "ports": [{"port": 1}]}]},
        "EndpointSlice": {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                          "metadata": {"name": "loopback-probe", "namespace": ns},
                          "addressType": "IPv4",
                          "endpoints": [{"addresses": ["127.0.0.1"]}],
                          "ports": [{"port": 1}]},
    }.items():
        r = cp.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(obj),
                       check=False)
        out[kind] = "" if r.returncode == 0 else r.stderr.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.controlplane",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["up", "down", "env", "status", "probe-loopback",
                                       "start-apiserver", "stop-aggapi"])
    p.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"),
                   choices=sorted(INSTANCES))
    p.add_argument("--node-name", default="aggapi-node-1")
    p.add_argument("--keep-state", action="store_true", help="down: keep logs and PKI")
    a = p.parse_args(argv)
    cp = ControlPlane(instance=a.instance, node_name=a.node_name)
    if a.command == "up":
        took = cp.up()
        log(f"control plane up in {took:.1f}s (state in {cp.state})")
        for k, v in cp.env().items():
            print(f"export {k}={v}")
    elif a.command == "down":
        cp.down(keep_state=a.keep_state)
        log(f"stopped; removed {cp.state}" if not a.keep_state else "stopped")
    elif a.command == "env":
        for k, v in cp.env().items():
            print(f"export {k}={v}")
    elif a.command == "status":
        print(json.dumps(cp.status(), indent=2))
    elif a.command == "probe-loopback":
        print(json.dumps(loopback_endpoints_rejected(cp), indent=2))
    elif a.command == "start-apiserver":
        cp.start_apiserver()
        log("aggapi apiserver running; APIService Available")
    elif a.command == "stop-aggapi":
        cp.stop_aggapi()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
