"""``bench_kubectl_cp --installed``: the processes on either path and their CPU seconds
and throttling over one transfer."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._cgroupstats import PodCgroup
from benchmarks._procstats import cpu_seconds
from tests.framework.clusternode import ClusterNode
from tests.framework.controlplane import ControlPlane


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def inner_pid(pid: int) -> int:
    """The daemon itself under ``nsenter --pid ... daemon`` (nsenter forks into the node's
    PID namespace and waits): its pidfile names the nsenter."""
    for _ in range(4):
        argv = _cmdline(pid)
        if not argv or Path(argv[0]).name not in ("nsenter", "unshare"):
            return pid
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if not kids:
            return pid
        pid = int(kids[0])
    return pid


def _pid_ns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def node_shims(node: ClusterNode) -> list[int]:
    """containerd-shims of ``node``: those in its PID namespace."""
    ctd = node.proc("containerd").pid()
    if ctd is None:
        raise SystemExit(f"{node.name}: containerd is not running")
    ns = _pid_ns(inner_pid(ctd))
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and (argv := _cmdline(int(d))) and "containerd-shim" in argv[0]:
            with contextlib.suppress(OSError):
                if _pid_ns(int(d)) == ns:
                    out.append(int(d))
    return out


def children_cpu() -> float:
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


@dataclass
class Pods:
    """The pods measured by their cgroups: label -> (pod name, node, cgroup)."""

    groups: dict[str, tuple[str, str, PodCgroup]] = field(default_factory=dict)

    def add(self, label: str, pod: dict[str, Any]) -> None:
        cg = PodCgroup.find(pod["metadata"]["uid"])
        if cg is None:
            raise SystemExit(f"no cgroup found for pod {pod['metadata']['name']}")
        self.groups[label] = (pod["metadata"]["name"], pod["spec"]["nodeName"], cg)


class Meter:
    """CPU seconds and throttling of every process of both paths over one transfer."""

    def __init__(self, cp: ControlPlane, node: ClusterNode, pods: Pods) -> None:
        self.pods = pods
        self.sources: dict[str, Callable[[], float]] = {}
        for name, pid in (("kube-apiserver", cp.proc("kube-apiserver").pid()),
                          ("kubelet", node.proc("kubelet").pid()),
                          ("containerd", node.proc("containerd").pid())):
            if pid is None:
                raise SystemExit(f"{name} is not running")
            self.sources[name] = functools.partial(cpu_seconds, inner_pid(pid))
        shims = node_shims(node)
        self.sources["containerd-shims"] = lambda: sum(cpu_seconds(p) for p in shims
                                                       if Path(f"/proc/{p}").exists())
        for label, (_, _, cg) in pods.groups.items():
            self.sources[label] = cg.cpu_seconds
        self.sources["client"] = children_cpu

    @contextlib.contextmanager
    def window(self, cpu: dict[str, float], thr: dict[str, list[float]]) -> Iterator[None]:
        before = {k: f() for k, f in self.sources.items()}
        thr0 = {k: cg.throttling() for k, (_, _, cg) in self.pods.groups.items()}
        yield
        for k, f in self.sources.items():
            cpu[k] = cpu.get(k, 0.0) + f() - before[k]
        for k, (_, _, cg) in self.pods.groups.items():
            n, s = cg.throttling()
            acc = thr.setdefault(k, [0.0, 0.0])
            acc[0] += n - thr0[k][0]
            acc[1] += s - thr0[k][1]


def python_pids(cg: PodCgroup) -> list[int]:
    """The pod's Python processes, by the executable they run (argv[0] may be a script)."""
    out = []
    for p in cg.pids():
        with contextlib.suppress(OSError):
            if "python" in Path(os.readlink(f"/proc/{p}/exe")).name:
                out.append(p)
    return out



def machine_busy_s(stat: str | None = None) -> float:
    """CPU seconds every core of the machine has been busy (``cpu`` line of /proc/stat:
    all but idle and iowait; guest time is already in user)."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    f = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
