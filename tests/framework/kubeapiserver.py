"""etcd and kube-apiserver of the control plane: their flags, start and readiness."""

from __future__ import annotations

from tests.framework.cpaccess import AdminAccess
from tests.framework.cplayout import FRONT_PROXY_CN, KUBE_PORT, SERVICE_CIDR
from tests.framework.kubetools import binary, feature_gates, has
from tests.framework.procs import free_port, spawn


class EtcdAndKubeAPIServer(AdminAccess):
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
