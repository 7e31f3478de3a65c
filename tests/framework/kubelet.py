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
from pathlib import Path

import yaml

from aggapi.runtime.cri import CRIClient
from tests.framework import nodestate
from tests.framework.controlplane import (
    INSTANCES,
    ControlPlane,
    binary,
)
from tests.framework.forgetimages import forget_images
from tests.framework.kubeletapiserver import (  # noqa: F401
    KubeletAPIServerSide,
    apiserver_flags,
    apiserver_kubelet_client_paths,
    ensure_apiserver_client_cert,
)
from tests.framework.kubeletfiles import KubeletFiles
from tests.framework.kubelethostchanges import KERNEL_TUNABLES, HostChanges  # noqa: F401
from tests.framework.kubeletlayout import (  # noqa: F401
    HEALTHZ_PORT,
    KUBELET_PORT,
    KubeletHost,
    log,
    pod_subnet,
)
from tests.framework.kubeletpods import HARNESS_LABEL, pod_manifest
from tests.framework.node import Node, ensure_node
from tests.framework.procs import HarnessError, spawn


# The concerns live in their modules (kubeletlayout: names and paths, kubeletfiles,
# kubeletapiserver, kubelethostchanges); __init__ is KubeletLayout's.
class Kubelet(KubeletFiles, KubeletAPIServerSide, HostChanges):
    """Start/stop one kubelet for ``cp``'s node; ``restart`` with other pull settings.

    ``node_name`` and ``workdir`` default to the control plane's node and
    ``<state>/kubelet``; a cluster node passes its own (tests.framework.clusternode)."""

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

    def tail(self, n: int = 40) -> str:
        return self.proc().tail(n)



DEMO_POD = "pull-demo"


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
