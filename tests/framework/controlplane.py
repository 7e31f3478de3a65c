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
import base64
import functools
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggapi.tls import certs, pki
from tests.framework import nodens, nodestate
from tests.framework.controllers import KCM, Controllers
from tests.framework.controllers import PROCS as CONTROLLER_PROCS

# Re-exported: the harness's users import these from here.
from tests.framework.kubetools import binary, feature_gates, has, kubeconfig, versions  # noqa: F401
from tests.framework.netns import Host, Network
from tests.framework.procs import HarnessError, Proc, free_port, spawn, wait_ready
from tests.framework.repo import REPO, python_env

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
# Users with their own kubeconfig, for RBAC tests: name -> groups.
# alice: edit-like (aggapi-view + aggapi-edit + pods/exec); victor: view-only (aggapi-view);
# mallory: no binding (hack/local/rbac.yaml).
DEFAULT_USERS: dict[str, list[str]] = {"alice": ["aggapi-e2e"], "victor": ["aggapi-e2e-view"],
                                       "mallory": []}


def log(msg: str) -> None:
    print(f"controlplane: {msg}", file=sys.stderr, flush=True)


@functools.cache
def supported_flags(command: str) -> frozenset[str]:
    """The ``--flags`` that ``aggapi <command> --help`` lists."""
    cp = subprocess.run([sys.executable, "-m", "aggapi", command, "--help"], text=True,
                        capture_output=True, cwd=REPO)
    return frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", cp.stdout))


# --- the control plane ---------------------------------------------------------------

@dataclass
class ControlPlane:
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

    # --- PKI ---------------------------------------------------------------------------
    def generate_pki(self, users: Mapping[str, Sequence[str]] = DEFAULT_USERS) -> None:
        d = self.pki_dir
        d.mkdir(parents=True, exist_ok=True)

        def pair(name: str, make: Any) -> pki.KeyPair:
            crt, key = d / f"{name}.crt", d / f"{name}.key"
            if crt.exists() and key.exists():
                return pki.load_pair(crt, key)
            kp: pki.KeyPair = make()
            kp.write(crt, key)
            return kp

        ca = pair("ca", lambda: pki.new_ca("aggapi-local-cluster-ca"))
        pair("apiserver", lambda: pki.issue(
            ca, "kube-apiserver", server=True,
            dns=["kubernetes", "kubernetes.default", "kubernetes.default.svc",
                 "kubernetes.default.svc.cluster.local", "localhost"],
            ips=["127.0.0.1", self.net.host_address, *SERVICE_IPS]))
        fp_ca = pair("front-proxy-ca", lambda: pki.new_ca("aggapi-local-front-proxy-ca"))
        pair("front-proxy-client", lambda: pki.issue(fp_ca, FRONT_PROXY_CN, client=True))
        pair("apiserver-kubelet-client",
             lambda: pki.issue(ca, APISERVER_KUBELET_CLIENT_CN, client=True))
        if not (d / "sa.key").exists():
            key = pki.new_key("rsa")
            pki.write_file(d / "sa.key", pki.private_key_pem(key), mode=0o600)
            pki.write_file(d / "sa.pub", pki.public_key_pem(key))
        admin = pair("admin", lambda: pki.issue(ca, "kubernetes-admin",
                                                orgs=["system:masters"], client=True))
        pki.write_file(self.admin_kubeconfig, kubeconfig(
            self.server, ca.cert_pem, admin.cert_pem, admin.key_pem, "kubernetes-admin").encode(),
            mode=0o600)
        sa = pair("aggapi-apiserver-client", lambda: pki.issue(
            ca, APISERVER_USER, orgs=["system:serviceaccounts",
                                      f"system:serviceaccounts:{NAMESPACE}"], client=True))
        pki.write_file(self.state / "aggapi-apiserver.kubeconfig", kubeconfig(
            self.server, ca.cert_pem, sa.cert_pem, sa.key_pem, APISERVER_USER).encode(),
            mode=0o600)
        for user, groups in users.items():
            self.add_user(user, groups, ca=ca)
        certs.generate(self.aggapi_certs, namespace=NAMESPACE, service=APISERVER_SERVICE,
                       agent_service=AGENT_SERVICE,
                       ips=["127.0.0.1", self.api_host.address, self.node_host.address])

    def add_user(self, user: str, groups: Iterable[str] = (), *,
                 ca: pki.KeyPair | None = None) -> Path:
        """A kubeconfig for ``user`` in ``groups`` (client cert of the cluster CA)."""
        path = self.user_kubeconfig(user)
        if path.exists():
            return path
        ca = ca or pki.load_pair(self.pki_dir / "ca.crt", self.pki_dir / "ca.key")
        kp = pki.issue(ca, user, orgs=list(groups), client=True)
        pki.write_file(path, kubeconfig(self.server, ca.cert_pem, kp.cert_pem, kp.key_pem,
                                        user).encode(), mode=0o600)
        return path

    # --- etcd + kube-apiserver ------------------------------------------------------------
    def start_etcd(self) -> None:
        if self.proc("etcd").alive():
            return
        port, peer = free_port(), free_port()
        (self.state / "etcd").mkdir(parents=True, exist_ok=True, mode=0o700)
        spawn("etcd", [
            binary("etcd"), "--name=aggapi", f"--data-dir={self.state / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{port}",
            f"--advertise-client-urls=http://127.0.0.1:{port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=aggapi=http://127.0.0.1:{peer}",
            "--initial-cluster-state=new", "--logger=zap", "--log-outputs=stderr",
        ], self.state)
        (self.state / "etcd.url").write_text(f"http://127.0.0.1:{port}\n")
        self._wait(lambda: self._http_ok(f"http://127.0.0.1:{port}/health"), 30, "etcd",
                   self.proc("etcd"))

    def kube_apiserver_args(self) -> list[str]:
        d = self.pki_dir
        etcd_url = (self.state / "etcd.url").read_text().strip()
        authn = self.state / "authentication-config.yaml"
        # Anonymous only for the health endpoints: any other unauthenticated request is a
        # 401. Releases before per-path anonymous turn anonymous off altogether (the
        # harness's own /readyz checks authenticate), so the 401s stay the same.
        if has("apiserver-anonymous-conditions"):
            authn.write_text(
                "apiVersion: apiserver.config.k8s.io/v1beta1\n"
                "kind: AuthenticationConfiguration\n"
                "anonymous:\n  enabled: true\n  conditions:\n"
                "  - path: /livez\n  - path: /readyz\n  - path: /healthz\n")
            anonymous = [f"--authentication-config={authn}"]
        else:
            anonymous = ["--anonymous-auth=false"]
        # aggapi reads the uid header's name from extension-apiserver-authentication and
        # does without one when the release writes none there.
        uid = (["--requestheader-uid-headers=X-Remote-Uid"]
               if has("apiserver-requestheader-uid") else [])
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in feature_gates().items())
        return [
            binary("kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            f"--bind-address={self.net.host_address}",
            f"--advertise-address={self.net.host_address}",
            f"--secure-port={KUBE_PORT}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--requestheader-client-ca-file={d / 'front-proxy-ca.crt'}",
            f"--requestheader-allowed-names={FRONT_PROXY_CN}",
            "--requestheader-username-headers=X-Remote-User",
            *uid,
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={d / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={d / 'front-proxy-client.key'}",
            "--enable-aggregator-routing=true",
            "--authorization-mode=Node,RBAC",
            *anonymous,
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={self.state / 'kube-apiserver-certs'}",
            *self.kubelet_client_flags(),
            *([f"--feature-gates={gates}"] if gates else []),
            "--v=1",
        ]

    def kubelet_client_flags(self) -> list[str]:
        """kube-apiserver -> kubelet (exec, attach, port-forward, logs, cp): its client
        cert; kubelets' serving certs verified against the cluster CA; InternalIP first,
        as a node's Hostname address (its name) does not resolve here. Passed from the
        start, so a kubelet joining later needs no restart of kube-apiserver."""
        d = self.pki_dir
        return [f"--kubelet-client-certificate={d / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={d / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={d / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname"]

    def start_kube_apiserver(self) -> None:
        if self.proc("kube-apiserver").alive():
            return
        p = spawn("kube-apiserver", self.kube_apiserver_args(), self.state)
        self._wait(lambda: self.readyz(), 120, "kube-apiserver /readyz", p)

    def _ssl(self, user: str = "admin") -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki_dir / "ca.crt"))
        if user == "admin":
            ctx.load_cert_chain(self.pki_dir / "admin.crt", self.pki_dir / "admin.key")
        return ctx

    def get(self, path: str, *, authenticated: bool = True,
            timeout: float = 5.0) -> tuple[int, bytes]:
        """GET ``path`` on kube-apiserver as admin (or with no credentials)."""
        return self.request("GET", path, authenticated=authenticated, timeout=timeout)

    def request(self, method: str, path: str, data: bytes | None = None, *,
                authenticated: bool = True, timeout: float = 5.0) -> tuple[int, bytes]:
        """``method`` ``path`` (with body ``data``) on kube-apiserver as admin (or with no
        credentials): the status and the whole body."""
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/octet-stream")
        ctx = self._ssl("admin" if authenticated else "none")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def timed_get(self, path: str, *, timeout: float = 5.0) -> tuple[int, float, float, bytes]:
        """GET ``path`` as admin: the status, seconds to the response's head and to its
        last byte, and the body (a server that builds its answer whole before sending
        spends the first; the transfer is the difference)."""
        req = urllib.request.Request(self.server + path)
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, context=self._ssl("admin"), timeout=timeout) as r:
                head = time.monotonic() - t0
                body = bytes(r.read())
                return int(r.status), head, time.monotonic() - t0, body
        except urllib.error.HTTPError as e:
            took = time.monotonic() - t0
            return int(e.code), took, took, bytes(e.read())

    def readyz(self) -> bool:
        try:
            return self.get("/readyz", timeout=2)[0] == 200
        except OSError:
            return False

    @staticmethod
    def _http_ok(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return int(r.status) == 200
        except OSError:
            return False

    @staticmethod
    def _wait(ok: Any, timeout: float, what: str, proc: Proc | None = None) -> None:
        wait_ready(ok, timeout, what, proc)

    # --- kubectl and objects -------------------------------------------------------------
    def kubectl(self, *args: str, user: str | None = None, input: str | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        kc = self.admin_kubeconfig if user is None else self.user_kubeconfig(user)
        cp = subprocess.run([binary("kubectl"), f"--kubeconfig={kc}", *args], input=input,
                            text=True, capture_output=True, timeout=120)
        if check and cp.returncode != 0:
            raise HarnessError(f"kubectl {' '.join(args)}: {cp.stderr.strip()}")
        return cp

    def apply(self, objs: Sequence[Mapping[str, Any]]) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts",
                     "--field-manager=aggapi-harness", "-f", "-",
                     input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))

    def objects(self) -> list[dict[str, Any]]:
        ca_bundle = base64.b64encode((self.aggapi_certs / "ca.crt").read_bytes()).decode()
        labels = {"app.kubernetes.io/part-of": "aggapi"}

        def svc_and_slice(name: str, port: int, target: int, address: str,
                          node: str | None) -> list[dict[str, Any]]:
            ep: dict[str, Any] = {"addresses": [address], "conditions": {"ready": True}}
            if node:
                ep["nodeName"] = node
            return [
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
                 # No selector: aggapi runs as host processes in network namespaces,
                 # outside any pod, so these EndpointSlices are the harness's (the
                 # pattern for out-of-cluster backends), not an endpointslice
                 # controller's stand-in. The agent Service is headless, as shipped.
                 "spec": {**({"clusterIP": "None"} if node else {}),
                          "ports": [{"name": "https", "port": port, "targetPort": target,
                                     "protocol": "TCP"}]}},
                {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                 "metadata": {"name": f"{name}-local", "namespace": NAMESPACE, "labels": {
                     **labels, "kubernetes.io/service-name": name,
                     "endpointslice.kubernetes.io/managed-by": "aggapi-harness"}},
                 "addressType": "IPv4", "endpoints": [ep],
                 "ports": [{"name": "https", "port": target, "protocol": "TCP"}]},
                # kube-aggregator before 1.33 resolves a Service through its Endpoints,
                # not its slices (--enable-aggregator-routing): no controller mirrors
                # slices into Endpoints, so the harness writes those too, marked
                # skip-mirror so the mirroring controller adds no second slice.
                *([] if has("aggregator-endpointslices") else [
                    {"apiVersion": "v1", "kind": "Endpoints",
                     "metadata": {"name": name, "namespace": NAMESPACE, "labels": {
                         **labels, "endpointslice.kubernetes.io/skip-mirror": "true"}},
                     "subsets": [{"addresses": [{"ip": address, **(
                         {"nodeName": node} if node else {})}],
                         "ports": [{"name": "https", "port": target, "protocol": "TCP"}]}]}]),
            ]

        return [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
            {"apiVersion": "v1", "kind": "Node",
             "metadata": {"name": self.node_name, "labels": {
                 "kubernetes.io/hostname": self.node_name, "kubernetes.io/os": "linux"}}},
            *svc_and_slice(APISERVER_SERVICE, 443, AGGAPI_PORT, self.api_host.address, None),
            *svc_and_slice(AGENT_SERVICE, AGENT_PORT, AGENT_PORT, self.node_host.address,
                           self.node_name),
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": APISERVICE, "labels": labels},
             "spec": {"group": GROUP, "version": VERSION,
                      "service": {"namespace": NAMESPACE, "name": APISERVER_SERVICE,
                                  "port": 443},
                      "caBundle": ca_bundle, "groupPriorityMinimum": 1000,
                      "versionPriority": 15}},
        ]

    def node_status(self) -> dict[str, Any]:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"status": {
            "addresses": [{"type": "InternalIP", "address": self.node_host.address},
                          {"type": "Hostname", "address": self.node_name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "AggapiHarness",
                            "message": "node served by the local aggapi agent",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": AGENT_PORT}},
        }}

    def rbac_files(self) -> list[Path]:
        """The shipped ServiceAccounts and RBAC, then the e2e users' bindings."""
        shipped = [REPO / "manifests/base" / f for f in
                   ("serviceaccounts.yaml", "rbac-apiserver.yaml", "rbac-aggregated.yaml")]
        missing = [str(f) for f in shipped if not f.exists()]
        if missing:
            raise HarnessError(f"shipped manifests missing: {missing}")
        return [*shipped, REPO / "hack/local/rbac.yaml"]

    def bootstrap(self) -> None:
        self.apply(self.objects())
        self.kubectl("apply", *(a for f in self.rbac_files() for a in ("-f", str(f))))
        self.kubectl("patch", "node", self.node_name, "--subresource=status", "--type=merge",
                     "-p", json.dumps(self.node_status()))
        # The serviceaccount controller creates them; pods are refused until it has.
        for ns in ("default", NAMESPACE):
            self._wait(lambda ns=ns: self.get(
                f"/api/v1/namespaces/{ns}/serviceaccounts/default")[0] == 200, 60,
                f"ServiceAccount {ns}/default (kube-controller-manager)",
                self.proc(KCM))

    # --- aggapi processes -----------------------------------------------------------------
    def apiserver_args(self, extra: Sequence[str] = ()) -> list[str]:
        c = self.aggapi_certs
        wanted = [
            f"--bind-address={self.api_host.address}", f"--secure-port={AGGAPI_PORT}",
            f"--tls-cert-file={c / 'apiserver.crt'}",
            f"--tls-private-key-file={c / 'apiserver.key'}",
            f"--kubeconfig={self.state / 'aggapi-apiserver.kubeconfig'}",
            # Towards the agents; passed once `aggapi apiserver` has these flags.
            f"--certs-dir={c}",
            f"--agent-ca-file={c / 'ca.crt'}",
            f"--agent-client-cert-file={c / 'agent-client.crt'}",
            f"--agent-client-key-file={c / 'agent-client.key'}",
            f"--token-signing-key-file={c / 'token-signing.key'}",
            f"--agent-namespace={NAMESPACE}", f"--agent-service={AGENT_SERVICE}",
            "--agent-port-name=https",
            # The harness's agents run outside pods: its EndpointSlices name no pod.
            "--agent-pod-check=false",
        ]
        known = supported_flags("apiserver")
        if "--tls-private-key-file" not in known:  # the flag's earlier name
            wanted.append(f"--tls-key-file={c / 'apiserver.key'}")
        return [sys.executable, "-m", "aggapi", "apiserver",
                *(a for a in wanted if a.split("=", 1)[0] in known), *extra]

    def agent_args(self, *, cri_socket: str, containerd_socket: str | None = None,
                   kubelet_config: str | None = None, extra: Sequence[str] = ()) -> list[str]:
        args = [
            sys.executable, "-m", "aggapi", "agent",
            f"--node-name={self.node_name}",
            f"--certs-dir={self.aggapi_certs}",  # agent.crt/key, ca.crt, token-signing.pub
            f"--bind-address={self.node_host.address}", f"--secure-port={AGENT_PORT}",
            f"--cri-address={cri_socket}",
            f"--containerd-address={containerd_socket or cri_socket}",
        ]
        if kubelet_config:
            args.append(f"--kubelet-config={kubelet_config}")
        return [*args, *extra]

    def start_apiserver(self, extra: Sequence[str] = (), *, wait: float = 60.0) -> Proc:
        """Start ``aggapi apiserver`` in its namespace; wait until the APIService is Available."""
        p = self.proc("aggapi-apiserver")
        if not p.alive():
            p = spawn("aggapi-apiserver",
                      [*self.api_host.exec_prefix(), *self.apiserver_args(extra)],
                      self.state, env=python_env())
        if wait:
            self._wait(self.apiservice_available, wait, "APIService Available", p)
        return p

    def start_agent(self, *, cri_socket: str, wait: float = 30.0, **kw: Any) -> Proc:
        """Start ``aggapi agent`` in the node's namespace; wait until its port accepts."""
        p = self.proc(nodestate.AGENT_PROC)
        if not p.alive():
            argv = [*self.node_host.exec_prefix(), *self.agent_args(cri_socket=cri_socket, **kw)]
            p = spawn(nodestate.AGENT_PROC, argv, self.state, env=python_env())
        if wait:
            self._wait(lambda: self._port_open(self.node_host.address, AGENT_PORT), wait,
                       "aggapi agent port", p)
        return p

    @staticmethod
    def _port_open(host: str, port: int) -> bool:
        try:
            with socket.create_connection((host, port), timeout=1):
                return True
        except OSError:
            return False

    def apiservice_available(self) -> bool:
        try:
            code, body = self.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{APISERVICE}")
        except OSError:
            return False
        if code != 200:
            return False
        conds = json.loads(body).get("status", {}).get("conditions") or []
        if not any(c.get("type") == "Available" and c.get("status") == "True" for c in conds):
            return False
        # The condition lags behind the backend: also ask the backend, through the aggregator.
        try:
            return self.get(f"/apis/{GROUP}/{VERSION}")[0] == 200
        except OSError:
            return False

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
