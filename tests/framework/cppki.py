"""The control plane's PKI: cluster and front-proxy CAs, serving and client certs, the
service-account key, admin and user kubeconfigs, aggapi's own certs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aggapi.tls import certs, pki
from tests.framework.cplayout import (
    AGENT_SERVICE,
    APISERVER_KUBELET_CLIENT_CN,
    APISERVER_SERVICE,
    APISERVER_USER,
    FRONT_PROXY_CN,
    NAMESPACE,
    SERVICE_IPS,
    ControlPlaneLayout,
)
from tests.framework.kubetools import kubeconfig

# Users with their own kubeconfig, for RBAC tests: name -> groups.
# alice: edit-like (aggapi-view + aggapi-edit + pods/exec); victor: view-only (aggapi-view);
# mallory: no binding (hack/local/rbac.yaml).
DEFAULT_USERS: dict[str, list[str]] = {"alice": ["aggapi-e2e"], "victor": ["aggapi-e2e-view"],
                                       "mallory": []}


class ClusterPKI(ControlPlaneLayout):
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
