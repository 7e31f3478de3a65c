"""The namespaces of one node of a multi-node cluster (tests.framework.cluster), kind-like.

A node is a small init process, PID 1 of a PID namespace of its own, in a mount namespace
of its own and in a network namespace on the control plane's bridge (tests.framework.netns):

    nsenter --net=/run/netns/<p>n<k> unshare --fork --pid --mount --propagation private
        --mount-proc --kill-child python3 -m tests.framework.nodens init --bind T=S ...

The node's containerd, kubelet and kube-proxy join all three with
``nsenter -t <init pid> --net --mount --pid`` (:meth:`NodeNamespaces.exec_prefix`). Why each:

- net: containerd's CRI runs the CNI plugins in its own network namespace, so the pods'
  veth host ends and the CNI bridge land in the node's; kube-proxy programs the iptables
  of the namespace it runs in; kubelet serves on the node's address.
- mount: the agent DaemonSet mounts hostPaths that are the same on every node
  (/run/containerd, /var/lib/aggapi-agent) and reads /var/lib/kubelet/config.yaml, so
  the init bind-mounts the node's own directories over them (:data:`BINDS`); everything
  else is the host's filesystem. Mounts made inside (pod volumes, rootfs, netns files)
  stay inside (propagation private) and vanish with the namespace.
- pid: a hostPID pod sees the node's processes, and /proc/1/root is the node init's root,
  whose mount namespace is the node's (the agent reads the kubelet config there).

Teardown (:meth:`NodeNamespaces.stop`): SIGKILL the init by its PID; the kernel then kills
every process of its PID namespace (containerd, shims, containers, kubelet, kube-proxy),
and the mount namespace goes with its last process. Then the network namespace and the
mountpoints this module had to create on the host are removed. Pidfiles (``pid
starttime``) as elsewhere in the harness; nothing is killed by name.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from tests.framework.containerd import remove_cgroup_tree
from tests.framework.netns import Host, Network, ip
from tests.framework.procs import HarnessError, Proc, spawn, start_time
from tests.framework.repo import python_env

# Path inside the node -> directory under the node's state directory bound over it.
BINDS = {
    "/run/containerd": "run-containerd",      # the CRI socket (criSocketDir) and shims
    "/var/lib/kubelet": "kubelet",            # kubelet's root dir and config.yaml
    "/var/lib/aggapi-agent": "aggapi-agent",  # the agent's copyStateDir
    "/var/lib/cni": "cni",                    # CNI results and IPAM state
    "/var/log/pods": "log-pods",
    "/var/log/containers": "log-containers",
    "/run/netns": "netns",                    # containerd's pod netns files
}


class NodeNamespaces:
    """One node's namespaces: ``start`` them, run things inside, ``stop`` them."""

    def __init__(self, net: Network, host: Host, node_dir: Path, state: Path,
                 name: str) -> None:
        self.net = net
        self.host = host
        self.dir = node_dir
        self.state = state  # where the pidfiles go (the control plane's state)
        self.name = name    # pidfile names: <name>-ns (unshare), <name>-init

    @property
    def unshare_proc(self) -> Proc:
        return Proc.named(self.state, f"{self.name}-ns")

    @property
    def init_proc(self) -> Proc:
        return Proc.named(self.state, f"{self.name}-init")

    def path(self, inside: str) -> Path:
        """The host path of a node path under one of :data:`BINDS`."""
        for target, sub in BINDS.items():
            if inside == target or inside.startswith(target + "/"):
                return self.dir / sub / inside[len(target):].lstrip("/")
        raise ValueError(f"{inside} is the host's, not the node's")

    def init_pid(self) -> int:
        pid = self.init_proc.pid()
        if pid is None:
            raise HarnessError(f"node {self.name}: its init is not running")
        return pid

    def exec_prefix(self) -> list[str]:
        """argv prefix that runs a command in the node's net, mount and PID namespaces."""
        return ["nsenter", "-t", str(self.init_pid()), "--net", "--mount", "--pid", "--"]

    def start(self, timeout: float = 10.0) -> None:
        self.stop()
        self.net.add(self.host)
        for k, v in (("net.ipv4.ip_forward", "1"),):
            ip("netns", "exec", self.host.netns, "sysctl", "-qw", f"{k}={v}")
        made = []
        for target, sub in BINDS.items():
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
            if not Path(target).exists():
                # A mountpoint must exist on the host; removed again by stop() if empty.
                Path(target).mkdir(parents=True)
                made.append(target)
        if made:
            with (self.dir / "made-mountpoints").open("a") as f:
                f.writelines(f"{m}\n" for m in made)
        ready = self.dir / "init.ready"
        ready.unlink(missing_ok=True)
        binds = [f"--bind={t}={self.dir / sub}" for t, sub in BINDS.items()]
        ns = spawn(self.unshare_proc.name, [
            "nsenter", f"--net=/run/netns/{self.host.netns}",
            "unshare", "--fork", "--pid", "--mount", "--propagation", "private",
            "--mount-proc", "--kill-child",
            sys.executable, "-m", "tests.framework.nodens", "init", f"--ready={ready}",
            *binds], self.state, env=python_env())
        deadline = time.monotonic() + timeout
        while not ready.exists():
            if not ns.alive() or time.monotonic() > deadline:
                raise HarnessError(f"node {self.name}: init not ready\n{ns.tail()}")
            time.sleep(0.02)
        pid = _only_child(ns.pid() or 0)
        self.init_proc.record(pid)

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node and wait for it (check, text, captured)."""
        return subprocess.run([*self.exec_prefix(), *argv], check=True, text=True,
                              capture_output=True, timeout=60)

    def stop(self) -> None:
        """Kill the init (and with it every process of the node), remove the network
        namespace and the host mountpoints made for the node. Safe to run twice."""
        pid = self.init_proc.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while self.init_proc.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
        self.init_proc.pidfile.unlink(missing_ok=True)
        self.unshare_proc.stop()
        self.net.remove(self.host)
        made = self.dir / "made-mountpoints"
        if made.exists():
            for m in reversed(made.read_text().split()):
                with contextlib.suppress(OSError):
                    Path(m).rmdir()  # only if empty: someone may have used it since
            made.unlink()

    def alive(self) -> bool:
        return self.init_proc.alive()


def teardown_all(state: Path, net: Network) -> None:
    """Stop every cluster node recorded under ``<state>/nodes/n*/node.json`` (written by
    tests.framework.clusternode) with no import of it, for ControlPlane.down: its init,
    processes, network namespace, host mountpoints, pod route and cgroups. Idempotent."""
    for info_file in sorted((state / "nodes").glob("n*/node.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(info_file.read_text())
            d = info_file.parent
            k = int(d.name[1:])
            ns = NodeNamespaces(net, Host(info["netns"], info["address"]), d, state, f"node{k}")
            ns.stop()
            for pidfile in (state / "pids").glob(f"node{k}-*.pid"):
                Proc.named(state, pidfile.stem).stop(timeout=2)
            ip("route", "del", info["pod_cidr"], check=False)
            remove_cgroup_tree(info["cgroup_parent"])
    restore_sysctls(state / "nodes")


def restore_sysctls(cluster_dir: Path) -> None:
    """Put back the sysctls saved in ``sysctls.json`` before the nodes' kubelets ran."""
    saved = cluster_dir / "sysctls.json"
    with contextlib.suppress(OSError, ValueError):
        for k, v in json.loads(saved.read_text()).items():
            with contextlib.suppress(OSError):
                Path("/proc/sys", k).write_text(v)
    saved.unlink(missing_ok=True)


def _only_child(pid: int) -> int:
    """The one child of ``pid`` (unshare's forked child: the node's init)."""
    for _ in range(100):
        with contextlib.suppress(OSError):
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
            if len(kids) == 1 and start_time(int(kids[0])):
                return int(kids[0])
        time.sleep(0.01)
    raise HarnessError(f"unshare {pid}: no child")


# --- the init, inside the namespaces ------------------------------------------------

def init(binds: Sequence[str], ready: Path) -> None:
    """PID 1 of a node: bind the node's directories, then reap orphans until killed."""
    for b in binds:
        target, source = b.split("=", 1)
        subprocess.run(["mount", "--bind", source, target], check=True)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready.write_text(f"{os.getpid()}\n")
    while True:
        # Orphans of the node (exited shims, say) are re-parented here: reap them.
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.framework.nodens", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    i = sub.add_parser("init", help="a node's PID 1 (started by NodeNamespaces.start)")
    i.add_argument("--bind", action="append", default=[], help="TARGET=SOURCE")
    i.add_argument("--ready", type=Path, required=True)
    a = p.parse_args(argv)
    if a.command == "init":
        init(a.bind, a.ready)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
