"""A real kubelet (the pinned release, or AGGAPI_KUBE_VERSION) on the harness node.

It runs as root in the host's network and mount namespaces, like a kubelet on a real
host, against the node's containerd (tests.framework.node: CRI v1, runc, cgroupfs on
this cgroup v1 machine) and registers the control plane's Node object
(``ControlPlane.node_name``). kube-scheduler (tests.framework.controllers) places pods
without ``spec.nodeName``; :func:`pod_manifest` binds them itself.

    kubelet      https://10.251.N.1:10250 (the host bridge address: kube-apiserver,
                 on the same bridge, reaches it; node InternalIP = that address)
                 serving cert and client cert (system:node:<name>) from the cluster CA
    config       <state>/node/kubelet.yaml: the file the aggapi agent reads
                 (--kubelet-config) for serializeImagePulls / maxParallelImagePulls
    root dir     <state>/kubelet/root, pod logs in <state>/kubelet/pod-logs
    cgroups      cgroupRoot = the node's cgroup parent (/aggapi-<instance>-<hex>), so the
                 node's cleanup removes every pod cgroup kubelet made
    pod network  CNI bridge ``agg<i>-cni0`` + host-local IPAM in 10.251.(64+N).0/24
                 (our own range), no gateway on the host, no default route, no NAT:
                 pods reach only each other. hostNetwork pods work too.

kube-apiserver needs four flags for exec/attach/cp/logs to reach kubelet
(:func:`apiserver_flags`); the control plane passes them from the start, and
:meth:`Kubelet.ensure_apiserver` restarts a kube-apiserver started without them.
Everything kubelet's config needed on this machine, and why, is in docs/kubelet-harness.md.

CLI: ``python3 -m tests.framework.kubelet up|down|status|config [--instance local]``
(after ``python3 -m tests.framework.controlplane up`` and ``python3 -m tests.framework.node
up``); ``demo`` does all of it for hack/local-up.sh and shows a real pod's pull live.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from aggapi.runtime.cri import CRIClient
from aggapi.runtime.errors import RuntimeCallError, RuntimeNotFound
from aggapi.tls import pki
from tests.framework import nodestate
from tests.framework.containerd import CGROUP_ROOT
from tests.framework.controlplane import (
    APISERVER_KUBELET_CLIENT_CN,
    INSTANCES,
    ControlPlane,
    binary,
    kubeconfig,
)
from tests.framework.kubetools import feature_gates, has, lacks
from tests.framework.node import Node, ensure_node
from tests.framework.nodestate import NodeInfo
from tests.framework.procs import HarnessError, Proc, spawn

KUBELET_PORT = 10250
HEALTHZ_PORT = 10248
# Sysctls kubelet sets when protectKernelDefaults is false (pkg/kubelet/cm, setupKernelTunables):
# recorded before it starts, restored after it stops.
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")
HARNESS_LABEL = "aggapi.io/harness"


def log(msg: str) -> None:
    print(f"kubelet: {msg}", file=sys.stderr, flush=True)


def pod_subnet(cp: ControlPlane) -> str:
    return f"10.251.{64 + INSTANCES[cp.instance]}.0/24"


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


class KubeletHost(Protocol):
    """What a kubelet needs of its node: tests.framework.node.Node, or a node of a
    multi-node cluster (tests.framework.clusternode)."""

    dir: Path
    info: NodeInfo

    @property
    def cri_address(self) -> str: ...


class Kubelet:
    """Start/stop one kubelet for ``cp``'s node; ``restart`` with other pull settings.

    ``node_name`` and ``workdir`` default to the control plane's node and
    ``<state>/kubelet``; a cluster node passes its own (tests.framework.clusternode)."""

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

    # --- files -------------------------------------------------------------------------
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

    # --- kube-apiserver side ------------------------------------------------------------
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

    # --- lifecycle -----------------------------------------------------------------------
    def start(self, *, wait: float = 90.0) -> float:
        """Write PKI, config, CNI; start kubelet; wait until the Node is Ready by it."""
        t0 = time.monotonic()
        if self.proc().alive():
            raise HarnessError(f"kubelet already running (pid {self.proc().pid()})")
        kubelet_bin = binary("kubelet")
        for d in (self.dir, self.root_dir, self.pod_logs_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.write_pki()
        self.ensure_apiserver()
        self.cp.apply(self.rbac())
        self.write_cni()
        self.write_config()
        self.make_cgroup_root()
        self.prepare_host()
        started = time.time()
        spawn(self.proc().name, self.argv(kubelet_bin), self.proc().pidfile.parent.parent)
        if wait:
            self.cp._wait(lambda: self.node_ready(since=started), wait, "kubelet: Node Ready",
                          self.proc())
        return time.monotonic() - t0

    def prepare_host(self) -> None:
        """Record what kubelet changes on this host (sysctls, /var/lib/kubelet)."""
        self._record_sysctls()
        if not Path("/var/lib/kubelet").exists():
            (self.dir / "made-var-lib-kubelet").touch()

    def argv(self, kubelet_bin: str) -> list[str]:
        return [kubelet_bin, f"--config={self.config_path}",
                f"--kubeconfig={self.kubeconfig_path}", f"--root-dir={self.root_dir}",
                f"--hostname-override={self.node_name}", f"--node-ip={self.address}",
                f"--v={self.verbosity}"]

    def node_ready(self, *, since: float = 0.0) -> bool:
        """The Node is Ready per kubelet (its version in nodeInfo, a fresh heartbeat)."""
        code, body = self.cp.get(f"/api/v1/nodes/{self.node_name}")
        if code != 200:
            return False
        st = json.loads(body).get("status") or {}
        if not (st.get("nodeInfo") or {}).get("kubeletVersion"):
            return False
        for c in st.get("conditions") or []:
            # reason KubeletReady: not the status the control plane writes by hand.
            if (c.get("type") == "Ready" and c.get("status") == "True"
                    and c.get("reason") == "KubeletReady"):
                hb = c.get("lastHeartbeatTime") or ""
                try:
                    beat = time.mktime(time.strptime(hb, "%Y-%m-%dT%H:%M:%SZ")) - time.timezone
                except ValueError:
                    return False
                return beat >= since - 1
        return False

    def delete_pods(self, timeout: float = 60.0) -> None:
        """Delete the pods made with :func:`pod_manifest` and wait until kubelet removed
        their sandboxes (call while kubelet runs)."""
        self.cp.kubectl("delete", "pods", "-A", "-l", f"{HARNESS_LABEL}=pod",
                        "--grace-period=0", "--force", "--wait=false", check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not asyncio.run(self._sandboxes(running_only=True)):
                return
            time.sleep(0.5)

    def stop(self, *, all_sandboxes: bool = False) -> None:
        """Stop kubelet by PID, then remove the sandboxes of its harness pods (all of them
        with ``all_sandboxes``) from containerd (CNI teardown included), its mounts, the
        CNI bridge and files; restore the sysctls it set, the node's previous kubelet.yaml
        and the Node status the control plane wrote (kubelet changed addresses)."""
        self.proc().stop(timeout=20)
        if self.node.info.containerd_dir and Path(self.node.cri_address).exists():
            with contextlib.suppress(Exception):
                asyncio.run(self._remove_sandboxes(all_sandboxes))
        self._unmount_under(self.dir)
        subprocess.run(["ip", "link", "del", self.cni_bridge], capture_output=True, check=False)
        self._remove_container_log_links()
        self._restore_sysctls()
        with contextlib.suppress(OSError):
            self.cni_conf.unlink()
        shutil.rmtree(self.root_dir, ignore_errors=True)
        marker = self.dir / "made-var-lib-kubelet"
        if marker.exists():
            # The device-plugin socket dir is fixed: /var/lib/kubelet/device-plugins.
            shutil.rmtree("/var/lib/kubelet", ignore_errors=True)
            marker.unlink()
        if self._prev_config is not None:
            if self._prev_config:
                self.config_path.write_text(self._prev_config)
            else:
                self.config_path.unlink(missing_ok=True)
            self._prev_config = None
        with contextlib.suppress(Exception):
            if self.cp.proc("kube-apiserver").alive():
                self.cp.kubectl("patch", "node", self.cp.node_name, "--subresource=status",
                                "--type=merge", "-p", json.dumps(self.cp.node_status()),
                                check=False)

    def restart(self, *, serialize_image_pulls: bool | None = None,
                max_parallel_image_pulls: int | bool | None = False) -> float:
        """Restart kubelet with other image-pull settings (the pods it runs survive).

        ``max_parallel_image_pulls=False`` keeps the current value; None unsets it."""
        if serialize_image_pulls is not None:
            self.serialize_image_pulls = serialize_image_pulls
        if max_parallel_image_pulls is not False:
            assert max_parallel_image_pulls is None or isinstance(max_parallel_image_pulls, int)
            self.max_parallel_image_pulls = max_parallel_image_pulls
        self.proc().stop(timeout=20)
        return self.start()

    async def _sandboxes(self, *, running_only: bool = False) -> list[str]:
        async with CRIClient(self.node.cri_address) as cri:
            return [sb.id for sb in await cri.list_pod_sandboxes({HARNESS_LABEL: "pod"})
                    if not running_only or sb.state == "SANDBOX_READY"]

    async def _remove_sandboxes(self, everything: bool) -> None:
        async with CRIClient(self.node.cri_address) as cri:
            for sb in await cri.list_pod_sandboxes(None if everything
                                                   else {HARNESS_LABEL: "pod"}):
                with contextlib.suppress(Exception):
                    await cri.stop_pod_sandbox(sb.id)
                with contextlib.suppress(Exception):
                    await cri.remove_pod_sandbox(sb.id)

    @staticmethod
    def _unmount_under(d: Path) -> None:
        prefix = str(d) + "/"
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
        for mp in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mp], capture_output=True, check=False)

    def _remove_container_log_links(self) -> None:
        """kubelet links /var/log/containers/*.log (a fixed path) into podLogsDir."""
        links = Path("/var/log/containers")
        if not links.is_dir():
            return
        for link in links.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(str(self.pod_logs_dir)):
                    link.unlink()
        with contextlib.suppress(OSError):
            links.rmdir()  # only if empty

    def _record_sysctls(self) -> None:
        if self._sysctls:
            return
        saved = self.dir / "sysctls.json"
        if saved.exists():  # a previous run died before restoring: keep the originals
            self._sysctls = json.loads(saved.read_text())
            return
        for k in KERNEL_TUNABLES:
            with contextlib.suppress(OSError):
                self._sysctls[k] = Path("/proc/sys", k).read_text().strip()
        saved.write_text(json.dumps(self._sysctls))

    def _restore_sysctls(self) -> None:
        saved = self.dir / "sysctls.json"
        if not self._sysctls and saved.exists():
            self._sysctls = json.loads(saved.read_text())
        for k, v in self._sysctls.items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", k).write_text(v)
        saved.unlink(missing_ok=True)
        self._sysctls = {}

    def tail(self, n: int = 40) -> str:
        return self.proc().tail(n)


# --- pods ------------------------------------------------------------------------------

def pod_manifest(name: str, containers: Sequence[Mapping[str, Any]], *, node: str,
                 namespace: str = "default", init_containers: Sequence[Mapping[str, Any]] = (),
                 host_network: bool = False, pull_policy: str = "IfNotPresent",
                 labels: Mapping[str, str] | None = None,
                 volumes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A pod bound to ``node`` (kube-scheduler not asked), quick to delete, no token."""

    def fill(c: Mapping[str, Any]) -> dict[str, Any]:
        return {"imagePullPolicy": pull_policy, **c}

    spec: dict[str, Any] = {
        "nodeName": node, "containers": [fill(c) for c in containers],
        "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
        "enableServiceLinks": False, "restartPolicy": "Always", "dnsPolicy": "Default",
    }
    if init_containers:
        spec["initContainers"] = [fill(c) for c in init_containers]
    if host_network:
        spec["hostNetwork"] = True
    if volumes:
        spec["volumes"] = [dict(v) for v in volumes]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {HARNESS_LABEL: "pod", **(labels or {})}},
            "spec": spec}


DEMO_POD = "pull-demo"


async def _remove_sandbox(cri: CRIClient, sandbox_id: str, timeout: float = 30.0) -> None:
    """Stop and remove a sandbox that kubelet may be tearing down at the same moment: the
    CNI delete of whichever stop comes second can fail ("failed to delete eth0: no such
    device") while the first is still under way. A stop is idempotent once the first has
    finished, so retry until it succeeds or the sandbox is gone."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await cri.stop_pod_sandbox(sandbox_id)
            await cri.remove_pod_sandbox(sandbox_id)
            return
        except RuntimeNotFound:
            return
        except RuntimeCallError:
            if sandbox_id not in {s.id for s in await cri.list_pod_sandboxes()}:
                return
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def forget_images(cri_address: str, *repos: str) -> None:
    """Remove images (every tag and digest of these repositories) so the next pod pulls
    them again. Sandboxes whose containers use them (left by pods just deleted; kubelet
    tears them down in its own time) go first: their snapshots would otherwise keep the
    layers, and containerd's next pull would skip them (nothing downloaded)."""

    def ours(name: str) -> bool:
        return any(name.split("/", 1)[-1].split("@")[0].split(":")[0] == r.split(":")[0]
                   for r in repos)

    async with CRIClient(cri_address) as cri:
        images = [img for img in await cri.list_images()
                  if any(ours(n) for n in (*img.repo_tags, *img.repo_digests))]
        ids = {img.id for img in images}
        holders = {c.sandbox_id for c in await cri.list_containers()
                   if ours(c.image) or c.image_ref in ids or c.image in ids}
        for sb in holders:
            await _remove_sandbox(cri, sb)
        for img in images:
            await cri.remove_image(img.id)


def demo(cp: ControlPlane, seconds: float = 35.0) -> None:
    """hack/local-up.sh: node (if not up) + kubelet (if not running), then a real pod whose
    ~150 MB image kubelet pulls through the throttle, its progress shown live."""
    node = ensure_node(cp)
    k = Kubelet(cp, node)
    if not k.proc().alive():
        log(f"node {cp.node_name} Ready in {k.start():.1f}s (real kubelet "
            f"https://{k.address}:{KUBELET_PORT})")
        node.start_agent()  # no-op if running; it re-reads kubelet.yaml by itself
    cp.kubectl("delete", "pod", DEMO_POD, "--grace-period=0", "--force", "--wait=true",
               "--ignore-not-found", check=False)
    image = node.via_throttle(node.images.big)
    asyncio.run(forget_images(node.cri_address, node.images.big))
    total = sum(size for _, size in node.images.big_layers)
    node.set_rate(total / seconds)
    cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest(
        DEMO_POD, [{"name": "app", "image": image}], node=cp.node_name)))
    path = (f"/apis/subresources.aggapi.io/v1alpha1/watch/namespaces/default/pods/"
            f"{DEMO_POD}/imagepullprogress?granularity=image")
    log(f"pod {DEMO_POD}: kubelet pulls {image} (~{seconds:.0f} s through the throttle); "
        f"live: kubectl get --raw '{path}'")
    try:
        subprocess.run([binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}", "get",
                        "--raw", path], check=False, timeout=seconds * 4)
    finally:
        node.set_rate(None)
    print(cp.kubectl("get", "events", f"--field-selector=involvedObject.name={DEMO_POD}",
                     check=False).stdout, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.kubelet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["up", "down", "status", "config", "demo"])
    p.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"),
                   choices=sorted(INSTANCES))
    p.add_argument("--serialize-image-pulls", default="true", choices=["true", "false"])
    p.add_argument("--max-parallel-image-pulls", type=int, default=None)
    a = p.parse_args(argv)
    cp = ControlPlane(instance=a.instance)
    if a.command == "demo":
        demo(cp)
        return 0
    if not nodestate.has_node(cp.state):
        raise HarnessError("no node: run python3 -m tests.framework.node up first")
    k = Kubelet(cp, Node.load(cp), serialize_image_pulls=a.serialize_image_pulls == "true",
                max_parallel_image_pulls=a.max_parallel_image_pulls)
    if a.command == "up":
        if k.proc().alive():
            log(f"already running (pid {k.proc().pid()})")
        else:
            log(f"node {cp.node_name} Ready in {k.start():.1f}s "
                f"(kubelet https://{k.address}:{KUBELET_PORT})")
    elif a.command == "down":
        k.stop(all_sandboxes=True)
    elif a.command == "config":
        print(yaml.safe_dump(k.config(), sort_keys=False))
    else:
        print(json.dumps({"pid": k.proc().pid(), "ready": k.node_ready()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
