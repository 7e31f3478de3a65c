"""The files a kubelet runs from: PKI and kubeconfig, KubeletConfiguration, CNI config,
its cgroup root."""

from __future__ import annotations

import json
from typing import Any

import yaml

from aggapi.tls import pki
from tests.framework.containerd import CGROUP_ROOT
from tests.framework.controlplane import kubeconfig
from tests.framework.kubeletapiserver import ensure_apiserver_client_cert
from tests.framework.kubeletlayout import HEALTHZ_PORT, KUBELET_PORT, KubeletLayout
from tests.framework.kubetools import feature_gates, has, lacks
from tests.framework.procs import HarnessError


class KubeletFiles(KubeletLayout):
    def write_pki(self) -> None:
        d = self.dir / "pki"
        d.mkdir(parents=True, exist_ok=True)
        ca = pki.load_pair(self.cp.pki_dir / "ca.crt", self.cp.pki_dir / "ca.key")
        if not (d / "kubelet.crt").exists():
            pki.issue(ca, self.node_name, server=True, dns=[self.node_name, "localhost"],
                      ips=[self.address, "127.0.0.1"]).write(d / "kubelet.crt", d / "kubelet.key")
        user = f"system:node:{self.node_name}"
        if not (d / "client.crt").exists():
            pki.issue(ca, user, orgs=["system:nodes"], client=True).write(
                d / "client.crt", d / "client.key")
        client = pki.load_pair(d / "client.crt", d / "client.key")
        pki.write_file(self.kubeconfig_path, kubeconfig(
            self.cp.server, ca.cert_pem, client.cert_pem, client.key_pem, user).encode(),
            mode=0o600)
        ensure_apiserver_client_cert(self.cp)

    def config(self) -> dict[str, Any]:
        """The KubeletConfiguration (see docs/kubelet-harness.md for each choice)."""
        sock = f"unix://{self.node.cri_address}"
        cfg: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # Serving: on the host bridge, where kube-apiserver is; certs from the cluster CA.
            "address": self.address, "port": KUBELET_PORT, "readOnlyPort": 0,
            "healthzBindAddress": self.address, "healthzPort": HEALTHZ_PORT,
            "tlsCertFile": str(self.dir / "pki/kubelet.crt"),
            "tlsPrivateKeyFile": str(self.dir / "pki/kubelet.key"),
            "authentication": {"anonymous": {"enabled": False},
                               "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.cp.pki_dir / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            # Runtime: the harness's containerd, CRI v1.
            "containerRuntimeEndpoint": sock, "imageServiceEndpoint": sock,
            # cgroup v1 host, containerd's runc uses cgroupfs (SystemdCgroup unset).
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": True, "cgroupRoot": self.node.info.cgroup_parent,
            "failSwapOn": False,
            # No CAP_SYS_RESOURCE on this VM: kubelet could not lower its own score.
            "oomScoreAdj": 0,
            # KEP-3673, read by the aggapi agent from this same file.
            "serializeImagePulls": self.serialize_image_pulls,
            # Leave big test images and a shared disk alone.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "podLogsDir": str(self.pod_logs_dir),
            "volumePluginDir": str(self.dir / "volume-plugins"),  # else /usr/libexec/...
            # Pods get no resolver of the host's (traffic stays here): dnsPolicy Default
            # with an empty resolv.conf.
            "resolvConf": "",
            "registerNode": True,
            "nodeStatusUpdateFrequency": "5s", "nodeStatusReportFrequency": "10s",
            "syncFrequency": "10s",
            "shutdownGracePeriod": "0s",
        }
        if gates := feature_gates():
            cfg["featureGates"] = gates
        if has("kubelet-failCgroupV1"):  # older kubelets take cgroup v1 as it is
            cfg["failCgroupV1"] = False
        if self.max_parallel_image_pulls is not None:
            if not has("kubelet-maxParallelImagePulls"):
                raise HarnessError(lacks("kubelet-maxParallelImagePulls"))
            cfg["maxParallelImagePulls"] = self.max_parallel_image_pulls
        cfg.update(self.extra_config)
        return cfg

    def write_config(self) -> None:
        if self._prev_config is None:
            self._prev_config = (self.config_path.read_text() if self.config_path.exists()
                                 else "")
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        tmp.replace(self.config_path)  # the agent re-reads it on change

    def cni_config(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0", "name": f"aggapi-{self.cp.instance}",
            "plugins": [{
                "type": "bridge", "bridge": self.cni_bridge,
                # No address on the host and no default route: pods talk to each other only.
                "isGateway": False, "isDefaultGateway": False, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": self.pod_subnet}]],
                         "dataDir": str(self.dir / "cni-ipam")},
            }],
        }

    def write_cni(self) -> None:
        conf = self.cni_config()
        self.cni_conf.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.cni_conf.with_suffix(".tmp")
        tmp.write_text(json.dumps(conf, indent=2))
        tmp.replace(self.cni_conf)

    def make_cgroup_root(self) -> None:
        """kubelet refuses a cgroupRoot that does not exist: create it in every v1
        hierarchy (cpuset needs its cpus and mems filled before tasks can join)."""
        rel = self.node.info.cgroup_parent.lstrip("/")
        if not rel:
            raise HarnessError("the node has no cgroup parent (node.json)")
        for hier in CGROUP_ROOT.iterdir():
            if not hier.is_dir() or hier.name == "unified" or hier.is_symlink():
                continue
            d = hier / rel
            d.mkdir(exist_ok=True)
            if hier.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (d / f).read_text().strip():
                        (d / f).write_text((hier / f).read_text())
