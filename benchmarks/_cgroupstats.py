"""CPU, throttling and memory of a Kubernetes pod from its cgroup, for the benchmarks.

A pod's processes run in containers that are not this host's children, and some of
them (the agent) fork workers: the pod's own cgroup is the one account that holds all
of them. cgroup v1 (this harness's hosts) keeps ``cpuacct`` (usage) and ``cpu``
(quota, throttling) in separate hierarchies; v2 keeps both in ``cpu.stat``.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _pids() -> list[int]:
    return [int(d) for d in os.listdir("/proc") if d.isdigit()]


def _cgroups(pid: int) -> dict[str, str]:
    """controller -> path of ``pid`` (v2's unified hierarchy under the key "")."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c.removeprefix("name=")] = path
    return out


def _cut_at(path: str, marks: tuple[str, ...]) -> str | None:
    """``path`` up to and including its first component naming one of ``marks``."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if any(m in part for m in marks):
            return "/".join(parts[:i + 1])
    return None


@dataclass(frozen=True)
class PodCgroup:
    """The cgroup directories of one pod (all its containers, the sandbox, exec'd
    processes): ``usage`` accounts CPU time, ``cpu`` holds quota and throttling."""

    usage: Path
    cpu: Path
    v2: bool

    @classmethod
    def find(cls, pod_uid: str) -> PodCgroup | None:
        marks = (pod_uid, pod_uid.replace("-", "_"))
        for pid in _pids():
            with contextlib.suppress(OSError, ValueError):
                groups = _cgroups(pid)
                if "cpuacct" in groups and (acct := _cut_at(groups["cpuacct"], marks)):
                    cpu = _cut_at(groups.get("cpu", groups["cpuacct"]), marks) or acct
                    return cls(ROOT / "cpuacct" / acct.lstrip("/"),
                               ROOT / "cpu" / cpu.lstrip("/"), v2=False)
                if "" in groups and "cpuacct" not in groups \
                        and (uni := _cut_at(groups[""], marks)):
                    p = ROOT / uni.lstrip("/")
                    return cls(p, p, v2=True)
        return None

    def _stat(self, d: Path) -> dict[str, int]:
        out = {}
        for line in (d / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value)
        return out

    def cpu_seconds(self) -> float:
        if self.v2:
            return self._stat(self.usage)["usage_usec"] / 1e6
        return int((self.usage / "cpuacct.usage").read_text()) / 1e9

    def throttling(self) -> tuple[int, float]:
        """(periods throttled, seconds throttled) so far."""
        st = self._stat(self.cpu)
        if self.v2:
            return st.get("nr_throttled", 0), st.get("throttled_usec", 0) / 1e6
        return st.get("nr_throttled", 0), st.get("throttled_time", 0) / 1e9

    def cpu_limit(self) -> float | None:
        """The pod's CPU limit in cores (None: unlimited)."""
        if self.v2:
            q, p = (self.cpu / "cpu.max").read_text().split()
            return None if q == "max" else int(q) / int(p)
        quota = int((self.cpu / "cpu.cfs_quota_us").read_text())
        period = int((self.cpu / "cpu.cfs_period_us").read_text())
        return None if quota < 0 else quota / period

    def pids(self) -> list[int]:
        out: list[int] = []
        for procs in self.usage.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                out += [int(p) for p in procs.read_text().split()]
        return out

    def peak_rss_mib(self) -> float:
        """The largest peak RSS (VmHWM) of one process in the pod, in MiB."""
        peak = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        peak = max(peak, int(line.split()[1]))
        return peak / 1024
