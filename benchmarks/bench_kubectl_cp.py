"""kubectl cp (kube-apiserver -> kubelet -> containerd's exec stream -> tar in the
container) against our copy (kubectl ncp: kube-apiserver -> aggregator -> aggapi -> agent),
same file, same kube-apiserver, same container, both ways, side by side in one run;
integrity checked on both (sha256 in the container after an upload, of the local file
after a download).

``--installed`` runs it on the path users run instead: the helm-installed add-on on the
two-node cluster of hack/local-up.sh, with a big file, many small files and medium ones,
CPU per pod from the cgroups and CFS throttling (:mod:`benchmarks._installed`). There,
by default (``--target-fs fresh``), every transfer's files on both sides live on a
journaled ext4 made just before it, so that small-file figures do not move with this
disk's recent deletions; ``--target-fs rootfs`` copies into the container's overlay
rootfs as before. What follows is the single-node harness with aggapi as host processes.

Beside MiB/s it prints the CPU-seconds per GiB of every process on either path, measured
over each transfer: kube-apiserver, kubelet, containerd, the pod's containerd-shims, the
pod's cgroup (tar, beside idle sleeps), aggapi apiserver, the agent, and the client
(kubectl or the ncp plugin, from the rusage of the waited child). On a machine whose
cores are all busy, throughput is set by the sum; the ratio of sums is an efficiency
ratio that holds on any machine.

Needs a running stack with a real kubelet on the instance (hack/local-up.sh, or):

    python3 -m tests.framework.controlplane up && python3 -m tests.framework.node up
    python3 -m tests.framework.kubelet up && python3 -m tests.framework.controlplane start-apiserver

or ``--up``: bring that stack up first and take it down at the end (wrap in
``flock /tmp/aggapi-e2e.lock`` where others share the machine).

Run: ``python3 -m benchmarks.bench_kubectl_cp [--instance local] [--size-mib 1024]
[--rounds 1] [--up]``. The container image is busybox with tar and sha256sum on PATH
(kubectl cp needs tar); the pod is deleted at the end. Goal (issue 15): ncp at least
2.0x kubectl cp, upload and download each.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks._busyboxtar import push_tar_image
from benchmarks._procstats import cpu_seconds, profiled, timed
from benchmarks._sourcetree import file_sha, make_file
from tests.framework import nodestate
from tests.framework.controlplane import INSTANCES, ControlPlane, binary
from tests.framework.kubelet import Kubelet, pod_manifest
from tests.framework.node import Node
from tests.framework.repo import REPO

POD = "bench-kubectl-cp"
MiB = 1 << 20
GOAL = 2.0
TOOLS = ("kubectl cp", "kubectl ncp")


def remote_sha(cp: ControlPlane, path: str) -> str:
    out = cp.kubectl("exec", POD, "--", "sha256sum", path).stdout
    return out.split()[0]


# --- who is on the path, and what each one spends ------------------------------------

def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _pids() -> Iterator[int]:
    for d in os.listdir("/proc"):
        if d.isdigit():
            yield int(d)


def _cpu_cgroup(pid: int) -> Path | None:
    """The cgroup directory that accounts ``pid``'s CPU: cgroup v1's cpuacct, else v2."""
    v2 = None
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return Path("/sys/fs/cgroup/cpuacct" + path)
        if controllers == "":
            v2 = Path("/sys/fs/cgroup" + path)
    return v2


def pod_cgroup(pod_uid: str) -> Path | None:
    """The CPU cgroup of the whole pod: its containers and what is exec'd in them (tar).
    Not a container's own: the pod's sandbox runs the same busybox `sleep` as the
    container, so a process found by its command line may be the sandbox."""
    want = (pod_uid, pod_uid.replace("-", "_"))
    for pid in _pids():
        if _cmdline(pid)[:2] != ["/bin/busybox", "sleep"]:
            continue
        try:
            cg = _cpu_cgroup(pid)
        except OSError:
            continue
        if cg is None:
            continue
        for i, part in enumerate(cg.parts):
            if any(w in part for w in want):
                return Path(*cg.parts[:i + 1])
    return None


def shim_pids(containerd_dir: str) -> list[int]:
    return [pid for pid in _pids()
            if (argv := _cmdline(pid)) and "containerd-shim" in argv[0]
            and any(containerd_dir in a for a in argv)]


def cgroup_cpu(path: Path) -> float:
    if (path / "cpuacct.usage").exists():
        return int((path / "cpuacct.usage").read_text()) / 1e9
    for line in (path / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return 0.0


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class Meter:
    """CPU seconds of every process of both paths over one transfer."""

    def __init__(self, cp: ControlPlane, node: Node, kubelet: Kubelet, pod_uid: str) -> None:
        self.sources: dict[str, Callable[[], float]] = {}
        for name, pid in (("kube-apiserver", cp.proc("kube-apiserver").pid()),
                          ("kubelet", kubelet.proc().pid()),
                          ("containerd", node.proc("containerd").pid()),
                          ("aggapi apiserver", cp.proc("aggapi-apiserver").pid()),
                          ("agent", cp.proc(nodestate.AGENT_PROC).pid())):
            if pid is None:
                raise SystemExit(f"{name} is not running")
            self.sources[name] = functools.partial(cpu_seconds, pid)
        shims = shim_pids(node.info.containerd_dir)
        self.sources["containerd-shims"] = lambda: sum(cpu_seconds(p) for p in shims)
        cg = pod_cgroup(pod_uid)
        if cg is None:
            raise SystemExit(f"no cgroup found for pod {pod_uid}")
        self.sources["pod (tar)"] = lambda: cgroup_cpu(cg)
        self.sources["client"] = children_cpu  # kubectl or ncp: waited children

    @contextmanager
    def window(self, into: dict[str, float]) -> Iterator[None]:
        before = {k: f() for k, f in self.sources.items()}
        yield
        for k, f in self.sources.items():
            into[k] = into.get(k, 0.0) + f() - before[k]


def run(cp: ControlPlane, size: int, rounds: int, workdir: Path,
        spy: Path | None = None, tools: tuple[str, ...] = TOOLS) -> dict[str, Any]:
    node = Node.load(cp)
    kubelet = Kubelet(cp, node)
    image = push_tar_image(node)
    cp.kubectl("delete", "pod", POD, "--grace-period=0", "--force", "--ignore-not-found",
               check=False)
    cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest(
        POD, [{"name": "c", "image": image}], node=cp.node_name)))
    cp.kubectl("wait", "--for=condition=Ready", f"pod/{POD}", "--timeout=120s")
    pod_uid = cp.kubectl("get", "pod", POD, "-o", "jsonpath={.metadata.uid}").stdout.strip()
    meter = Meter(cp, node, kubelet, pod_uid)
    src = workdir / "payload.bin"
    back = workdir / "back.bin"
    sha = make_file(src, size)
    kc = [binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}"]
    ncp = [sys.executable, "-m", "aggapi.plugins.ncp", "-q", f"--kubeconfig={cp.admin_kubeconfig}"]
    spied = {"aggapi apiserver": cp.proc("aggapi-apiserver").pid(),
             "agent": cp.proc(nodestate.AGENT_PROC).pid()}

    def client(tool: str, key: str, argv: list[str]) -> list[str]:
        if spy is None or tool != "kubectl ncp":
            return argv
        return ["py-spy", "record", "-r", "97", "-n", "-f", "raw", "-o",
                str(spy / f"{key.replace(' ', '_')}-client.txt"), "--", *argv]
    up_argv = {"kubectl cp": lambda r: [*kc, "cp", str(src), f"default/{POD}:{r}"],
               "kubectl ncp": lambda r: [*ncp, str(src), f"default/{POD}:{r}"]}
    down_argv = {"kubectl cp": lambda r: [*kc, "cp", f"default/{POD}:{r}", str(back)],
                 "kubectl ncp": lambda r: [*ncp, f"default/{POD}:{r}", str(back)]}
    remote = {"kubectl cp": "/tmp/kcp.bin", "kubectl ncp": "/tmp/ncp.bin"}
    secs: dict[str, list[float]] = {}
    cpu: dict[str, dict[str, float]] = {}
    try:
        for _ in range(rounds):
            for tool in tools:  # uploads, each checked from inside the container
                key = f"{tool} upload"
                os.sync()  # start on clean file systems, as in _kcpbench.Bench.scenario
                with profiled(spy if tool == "kubectl ncp" else None, key, spied), \
                        meter.window(cpu.setdefault(key, {})):
                    t = timed(client(tool, key, up_argv[tool](remote[tool])), REPO)
                assert remote_sha(cp, remote[tool]) == sha, f"{key}: sha256 mismatch"
                secs.setdefault(key, []).append(t)
            # Both download the file tar wrote in the container: the agent has never
            # hashed it (a file it wrote itself would have its sha256 cached already).
            cold = remote["kubectl cp" if "kubectl cp" in tools else tools[0]]
            for tool in tools:  # downloads of the same file, checked here
                key = f"{tool} download"
                back.unlink(missing_ok=True)
                os.sync()
                with profiled(spy if tool == "kubectl ncp" else None, key, spied), \
                        meter.window(cpu.setdefault(key, {})):
                    t = timed(client(tool, key, down_argv[tool](cold)), REPO)
                assert file_sha(back) == sha, f"{key}: sha256 mismatch"
                secs.setdefault(key, []).append(t)
            cp.kubectl("exec", POD, "--", "rm", "-f", *remote.values())
    finally:
        cp.kubectl("delete", "pod", POD, "--grace-period=0", "--force", "--wait=false",
                   check=False)
    gib = size * rounds / (1 << 30)
    best = {k: min(v) for k, v in secs.items()}
    mibs = {k: size / MiB / t for k, t in best.items()}
    ratios = {d: mibs[f"kubectl ncp {d}"] / mibs[f"kubectl cp {d}"]
              for d in ("upload", "download") if len(tools) == len(TOOLS)}
    per_gib = {k: {p: round(s / gib, 3) for p, s in v.items()} for k, v in cpu.items()}
    return {"size_bytes": size, "rounds": rounds, "sha256": sha, "seconds": secs,
            "best_seconds": best, "MiB_per_s": {k: round(v, 1) for k, v in mibs.items()},
            "ratio_ncp_over_kubectl_cp": {k: round(v, 2) for k, v in ratios.items()},
            "cpu_s_per_gib": per_gib,
            "integrity": "sha256 verified in the container (uploads) and here (downloads)"}


def report(r: dict[str, Any], size_mib: int) -> None:
    print(f"{size_mib} MiB, best of {r['rounds']} round(s), {os.cpu_count()} CPUs (shared)")
    for k, v in r["MiB_per_s"].items():
        print(f"  {k:22s} {v:8.1f} MiB/s  ({r['best_seconds'][k]:.1f} s)")
    procs: list[str] = []
    for used in r["cpu_s_per_gib"].values():
        procs += [p for p in used if p not in procs]
    print("CPU-seconds per GiB (mean of rounds), every process on either path:")
    print(f"  {'':22s}" + "".join(f"{p[:16]:>17s}" for p in procs) + f"{'total':>8s}")
    totals = {}
    for k, used in r["cpu_s_per_gib"].items():
        totals[k] = sum(used.values())
        print(f"  {k:22s}" + "".join(f"{used.get(p, 0.0):17.2f}" for p in procs)
              + f"{totals[k]:8.2f}")
    for d, ratio in r["ratio_ncp_over_kubectl_cp"].items():
        eff = totals[f"kubectl cp {d}"] / totals[f"kubectl ncp {d}"]
        print(f"goal ncp >= {GOAL}x kubectl cp, {d}: {ratio:.2f}x throughput, "
              f"{eff:.2f}x CPU efficiency -> {'met' if ratio >= GOAL else 'NOT met'}")
    print(f"integrity: {r['integrity']}")


def stack_up(cp: ControlPlane) -> None:
    from tests.framework.node import ensure_node

    cp.up()
    cp.start_apiserver()
    node = ensure_node(cp)
    Kubelet(cp, node).start()


def stack_down(cp: ControlPlane) -> None:
    node = Node.load(cp) if nodestate.has_node(cp.state) else None
    if node is not None:
        Kubelet(cp, node).stop(all_sandboxes=True)
        node.stop()
    cp.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_kubectl_cp",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--py-spy", type=Path, metavar="DIR",
                   help="profile aggapi apiserver, agent and the ncp client into DIR "
                   "(raw collapsed stacks; the CPU figures then include py-spy's cost)")
    p.add_argument("--ncp-only", action="store_true",
                   help="skip kubectl cp (while iterating on ncp's CPU figures)")
    p.add_argument("--up", action="store_true",
                   help="bring the stack up first, take it down at the end")
    inst = p.add_argument_group("--installed: the helm-installed add-on (benchmarks._installed)")
    inst.add_argument("--installed", action="store_true",
                      help="on the two-node cluster of hack/local-up.sh (with --up: brought "
                      "up and installed from this checkout if not running, taken down after)")
    inst.add_argument("--scenario", default="big,small,medium",
                      help="comma-separated: big (one --size-mib file), small (--small-files "
                      "of 4 KiB), medium (--medium-files of 10 MiB)")
    inst.add_argument("--small-files", type=int, default=10_000)
    inst.add_argument("--medium-files", type=int, default=100)
    inst.add_argument("--node", type=int, default=2, help="the pod's node (aggapi-worker-N)")
    inst.add_argument("--variant", action="append", default=[], metavar="LABEL=K=V[,K=V]",
                      help="run every scenario once per chart variant (helm upgrade --set), "
                      "side by side; ncp=DIR among them runs the ncp client from the "
                      "checkout DIR (e.g. main's, from git archive) instead of this one, "
                      "suite=SUITE the pods on this checkout's image built on Debian SUITE "
                      "(hack/build-image.sh --suite; e.g. bookworm, trixie), src=DIR "
                      "with suite= that image built from the checkout DIR")
    inst.add_argument("--perf-only", action="store_true",
                      help="with --py-spy DIR: perf record on the pods and the client "
                      "instead of py-spy (which pauses what it samples)")
    inst.add_argument("--target-fs", choices=("fresh", "rootfs"), default="fresh",
                      help="where each transfer's files live: fresh (a new journaled ext4 "
                      "per transfer on both sides, loop-mounted; the pod's under /data) or "
                      "rootfs (the container's overlay rootfs and this host's root fs, "
                      "whose recent deletions move small-file figures)")
    inst.add_argument("--settle", type=float, default=0.0, metavar="S",
                      help="wait S seconds before each directory upload (35 lets ext4 "
                      "without a journal forget inodes freed just before; see "
                      "benchmarks._kcpbench.UPLOAD_SETTLE_S); 0 by default: a fresh "
                      "file system has no deletions to forget")
    inst.add_argument("--json", type=Path, metavar="FILE",
                      help="write the ratios per scenario and goal_met")
    a = p.parse_args(argv)
    if a.installed:
        return installed_main(a)
    if a.instance not in INSTANCES:  # a private instance (tests, development)
        INSTANCES[a.instance] = max(INSTANCES.values()) + 1
    cp = ControlPlane(instance=a.instance)
    try:
        if a.up:
            stack_up(cp)
        with tempfile.TemporaryDirectory(prefix="bench-kcp-", dir=REPO / ".local") as d:
            if a.py_spy:
                a.py_spy.mkdir(parents=True, exist_ok=True)
            r = run(cp, a.size_mib * MiB, a.rounds, Path(d), a.py_spy,
                    TOOLS if a.ncp_only is False else ("kubectl ncp",))
    finally:
        if a.up:
            stack_down(cp)
    report(r, a.size_mib)
    print(json.dumps(r))
    return 0


def installed_main(a: argparse.Namespace) -> int:
    from benchmarks import _installed, _kcpbench

    _kcpbench.UPLOAD_SETTLE_S = a.settle
    scs = _installed.scenarios(a.size_mib, a.small_files, a.medium_files,
                               [s for s in a.scenario.split(",") if s])
    results = _installed.run_installed(a.instance, a.up, a.node, scs, a.rounds, a.variant,
                                       a.py_spy, a.perf_only, a.target_fs)
    summary = {label: _installed.goals(r) for label, r in results.items()}
    last = summary[list(summary)[-1]]
    for label, s in summary.items():
        print(f"{label}: goals (big >= 2.0x, small >= 1.0x, both ways) "
              f"{'met' if s['goal_met'] else 'NOT met'}")
    if a.json:
        a.json.write_text(json.dumps({**last, "target_fs": a.target_fs, "settle_s": a.settle,
                                      "variants": summary, "runs": results},
                                     indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
