"""``bench_kubectl_cp --installed``: kubectl cp against kubectl ncp on the path users run,
the helm-installed add-on on the two-node cluster of hack/local-up.sh.

A busybox+tar pod on one node (``--node``); kubectl cp goes kube-apiserver -> that node's
kubelet -> containerd's exec stream -> tar in the container; ncp goes kube-apiserver ->
aggregator -> whichever aggapi apiserver replica the aggregator picks -> the agent pod
on the pod's node. Scenarios, both ways: one big file, a tree of many small files,
a directory of medium files. Rounds alternate the tools' order. Integrity: sha256 of
every file, in the container (busybox sha256sum) after an upload and here after a
download.

CPU per GiB per process: kube-apiserver (host process), the pod's node's kubelet and
containerd (their own PIDs inside the node's PID namespace), that node's
containerd-shims, and from each pod's cgroup: the bench pod (tar), the aggapi apiserver
replicas, the agent; the client (kubectl or ncp) from this process's waited children.
Throttling (periods and seconds) per pod from the cgroup's cpu.stat, beside its limit.

``--variant LABEL=K=V[,K=V...]`` (repeatable) runs every scenario once per chart variant
(``helm upgrade --set``, then every pod Ready again), side by side in one run;
``suite=SUITE`` among the values runs the pods on this checkout's image built on that
Debian suite (``hack/build-image.sh --suite``), with the TLS floor measured inside it;
with ``src=DIR`` too, the image of the checkout at DIR instead (``ncp=DIR`` runs its
client as well): a change's before and after, side by side in one run.

Where the files live (``--target-fs``, printed in each variant's header and in the JSON):

- ``fresh`` (the default): every transfer's files, on both sides, on a journaled ext4
  made just before it (:mod:`benchmarks._freshfs`: a sparse image on a loop device).
  The pod gets a hostPath volume at ``/data`` on a directory under
  /var/lib/aggapi-bench/ made a shared mount in its node's mount namespace, with
  ``mountPropagation: HostToContainer``; each upload (each tool, each round) goes to
  ``/data/<fs>/`` on a file system of its own, mounted there in the node's namespace.
  Here, the upload source is made once per scenario on one fresh file system, and each
  download lands on one of its own. No tool then creates files near earlier deletions,
  which on this VM's journal-less root ext4 cost whichever tool came after them up to
  60% more (``recently_deleted`` in ext4's inode allocator) and made small-file figures
  swing by half between runs of the same code. Production nodes run a journaled ext4
  or xfs. Everything is unmounted, detached and removed at the end, failure or not.
- ``rootfs``: the earlier behaviour: uploads into the container's overlay root file
  system (/tmp), downloads into the work directory, both on this host's root file
  system. That is where users often copy too, but its figures depend on the disk's
  recent history; ``--settle S`` waits S seconds before each directory upload to let
  the kernel forget recently freed inodes (35 s covers it; default 0).

Each tool first makes one untimed tiny copy each way (cold binaries, a checkout's .pyc
files). Beside each round's seconds the report prints the machine's CPU-seconds outside
the processes measured: on shared cores, the other work that slowed that round.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._busyboxtar import push_tar_image
from benchmarks._cgroupstats import PodCgroup
from benchmarks._freshfs import FreshFs, fresh_fs, image_bytes
from benchmarks._procstats import cpu_seconds, profiled
from benchmarks._sourcetree import file_sha, source_tree
from tests.framework.addon import IMAGE_ARCHIVE, IMAGE_REPOSITORY, Addon, addon_of
from tests.framework.cluster import Cluster, registry_of
from tests.framework.clusternode import ClusterNode
from tests.framework.controlplane import ControlPlane, binary
from tests.framework.kubelet import pod_manifest
from tests.framework.repo import REPO

MiB = 1 << 20
GiB = 1 << 30
TOOLS = ("kubectl cp", "kubectl ncp")
KCP_ATTEMPTS = 3  # kubectl cp runs per transfer before the bench gives up
# Goals of issue 27: ncp over kubectl cp, both ways (no goal for "medium": reported).
GOALS = {"big": 2.0, "small": 1.0}
BUSYBOX = "/bin/busybox"


@dataclass(frozen=True)
class Scenario:
    name: str
    files: int
    file_bytes: int

    @property
    def total(self) -> int:
        return self.files * self.file_bytes

    @property
    def is_dir(self) -> bool:
        return self.name != "big"


def scenarios(size_mib: int, small_files: int, medium_files: int,
              chosen: list[str]) -> list[Scenario]:
    every = {"big": Scenario("big", 1, size_mib * MiB),
             "small": Scenario("small", small_files, 4096),
             "medium": Scenario("medium", medium_files, 10 * MiB)}
    return [every[c] for c in chosen]


# --- payloads and their digests ------------------------------------------------------

def tree_digest(lines: dict[str, str]) -> str:
    """One digest of a tree: sha256 over sorted ``relpath sha256`` lines."""
    text = "".join(f"{p} {d}\n" for p, d in sorted(lines.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def local_digest(path: Path) -> str:
    if path.is_file():
        return file_sha(path)
    return tree_digest({str(f.relative_to(path)): file_sha(f)
                        for f in path.rglob("*") if f.is_file()})


def make_payload(sc: Scenario, workdir: Path) -> Path:
    """The scenario's source: a file, or a tree (100 files per directory)."""
    if not sc.is_dir:
        path = workdir / "big.bin"
        with path.open("wb") as f:
            left = sc.file_bytes
            while left:
                chunk = os.urandom(min(left, 8 * MiB))
                f.write(chunk)
                left -= len(chunk)
        return path
    return source_tree(workdir / sc.name, sc.files, sc.file_bytes)


# --- the processes on either path ----------------------------------------------------

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


# --- one run -------------------------------------------------------------------------

POD = "bench-kubectl-cp"
TARGET_FS = ("fresh", "rootfs")  # --target-fs: see the module's docstring
DATA = "/data"  # the pod's volume of fresh file systems (--target-fs fresh)
SHARED_ROOT = Path("/var/lib/aggapi-bench")  # its host directories, one per run
TARGET_FS_TEXT = {
    "fresh": "a fresh journaled ext4 per transfer, both sides (loop images)",
    "rootfs": "the container's overlay rootfs and this host's root fs"}


def bench_pod(image: str, node: str, data: Path | None) -> dict[str, Any]:
    """The bench's pod; with ``data``, that host directory at /data, seeing the file
    systems mounted below it after the pod started (HostToContainer: the container's
    mount is a slave of the node's, which :meth:`FreshFs.share` made shared)."""
    container: dict[str, Any] = {"name": "c", "image": image}
    volumes: list[dict[str, Any]] = []
    if data is not None:
        volumes.append({"name": "data", "hostPath": {"path": str(data), "type": "Directory"}})
        container["volumeMounts"] = [{"name": "data", "mountPath": DATA,
                                      "mountPropagation": "HostToContainer"}]
    return pod_manifest(POD, [container], node=node, volumes=volumes)


def timed(argv: list[str], cwd: Path = REPO) -> float:
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    took = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}... failed: {r.stderr.strip()[-2000:]}")
    return took


class Bench:
    def __init__(self, cluster: Cluster, addon: Addon, node: ClusterNode, workdir: Path,
                 spy: Path | None, ncp_root: Path = REPO, perf_only: bool = False,
                 target_fs: str = "fresh") -> None:
        # Where ``python3 -m aggapi.plugins.ncp`` runs (its aggapi): another checkout's
        # client side by side with this one's.
        self.ncp_root = ncp_root
        self.cp = cluster.cp
        self.cluster = cluster
        self.addon = addon
        self.node = node
        self.workdir = workdir
        self.spy = spy
        self.perf_only = perf_only  # with spy: perf on the pods and the client, no py-spy
        self.target_fs = target_fs
        self.data: Path | None = None  # with "fresh": the pod's /data on the host

    @property
    def fresh(self) -> bool:
        return self.target_fs == "fresh"

    def kubectl(self, *args: str) -> str:
        return self.cp.kubectl(*args).stdout

    def start_pod(self) -> dict[str, Any]:
        image = push_tar_image(self.cluster.registry)
        self.cp.kubectl("delete", "pod", POD, "--grace-period=0", "--force",
                        "--ignore-not-found", check=False)
        self.cp.kubectl("create", "-f", "-", input=json.dumps(
            bench_pod(image, self.node.name, self.data)))
        self.kubectl("wait", "--for=condition=Ready", f"pod/{POD}", "--timeout=120s")
        pod: dict[str, Any] = json.loads(self.kubectl("get", "pod", POD, "-o", "json"))
        return pod

    def check_mounted(self, path: str) -> None:
        """``path`` is a file system of its own in the container (and so for the agent,
        which resolves paths in the container's mount namespace), not the directory
        beneath it on the host's root: the mount propagated."""
        if path not in container_ext4(self.kubectl("exec", POD, "--", BUSYBOX, "cat",
                                                   "/proc/self/mounts")):
            raise SystemExit(f"{path}: the fresh file system mounted on the node did not "
                             "reach the container (HostToContainer propagation)")

    def warm_up(self, tool_argv: dict[str, list[str]]) -> None:
        """One untimed tiny copy each way per tool: the first run of a client pays for
        cold binaries and, for a checkout's ncp, writing its .pyc files (3.96 s against
        1.66 s for kubectl cp's first small upload in one run)."""
        one = self.workdir / "warm-up"
        one.write_bytes(b"x")
        # An installed client has its .pyc files (pip and shiv write them), but this
        # process may run with PYTHONDONTWRITEBYTECODE, so a checkout's ncp would
        # compile itself on every run (30-40 ms of CPU a run): compile it once here.
        subprocess.run([sys.executable, "-m", "compileall", "-q", "aggapi"],
                       cwd=self.ncp_root, check=True, env={**os.environ,
                                                           "PYTHONDONTWRITEBYTECODE": ""})
        for tool, argv in tool_argv.items():
            root = self.ncp_root if tool == "kubectl ncp" else REPO
            there = f"default/{POD}:/tmp/warm-up-{tool.split()[-1]}"
            timed([*argv, str(one), there], root)
            timed([*argv, there, f"{one}-{tool.split()[-1]}"], root)

    def remote_digest(self, path: str, is_dir: bool) -> str:
        if not is_dir:
            return self.kubectl("exec", POD, "--", BUSYBOX, "sha256sum", path).split()[0]
        out = self.kubectl("exec", POD, "--", BUSYBOX, "sh", "-c",
                           f"cd {path} && {BUSYBOX} find . -type f | "
                           f"{BUSYBOX} xargs {BUSYBOX} sha256sum")
        lines = {}
        for line in out.splitlines():
            digest, _, rel = line.partition("  ")
            lines[rel.removeprefix("./")] = digest
        return tree_digest(lines)

    def pods(self) -> Pods:
        pods = Pods()
        pods.add("pod (tar)", json.loads(self.kubectl("get", "pod", POD, "-o", "json")))
        for p in self.addon.apiserver_pods():
            if self.addon.ready(p):
                pods.add(f"aggapi apiserver@{p['spec']['nodeName'][-1]}", p)
        pods.add("agent", self.addon.agent_pod(self.node.name))
        return pods

    def run(self, scs: list[Scenario], rounds: int) -> dict[str, Any]:
        print(f"bench: files on {TARGET_FS_TEXT[self.target_fs]}, settle "
              f"{UPLOAD_SETTLE_S:g} s", file=sys.stderr, flush=True)
        with fresh_fs(self.workdir / "images", warn=warn) as shared:
            if self.fresh:
                SHARED_ROOT.mkdir(parents=True, exist_ok=True)
                self.data = shared.share(SHARED_ROOT / f"run-{uuid.uuid4().hex[:12]}",
                                         self.node.ns.exec_prefix())
            return self._run(scs, rounds)

    def _run(self, scs: list[Scenario], rounds: int) -> dict[str, Any]:
        self.start_pod()
        pods = self.pods()
        meter = Meter(self.cp, self.node, pods)
        limits = {k: cg.cpu_limit() for k, (_, _, cg) in pods.groups.items()}
        kc = [binary("kubectl"), f"--kubeconfig={self.cp.admin_kubeconfig}"]
        ncp = [sys.executable, "-m", "aggapi.plugins.ncp", "-q",
               f"--kubeconfig={self.cp.admin_kubeconfig}"]
        tool_argv = {"kubectl cp": [*kc, "cp"], "kubectl ncp": ncp}
        remote = {"kubectl cp": "/tmp/kcp", "kubectl ncp": "/tmp/ncp"}
        spied = {label.replace(" ", "_").replace("@", "-") + f"-{pid}": pid
                 for label, (_, _, cg) in pods.groups.items() if label != "pod (tar)"
                 for pid in python_pids(cg)}
        out: dict[str, Any] = {"pods": {k: {"pod": n, "node": node, "cpu_limit": limits[k]}
                                        for k, (n, node, _) in pods.groups.items()}}
        self.warm_up(tool_argv)
        out["target_fs"] = self.target_fs
        out["settle_s"] = UPLOAD_SETTLE_S
        try:
            for sc in scs:
                with fresh_fs(self.workdir / "images", warn=warn) as fs:
                    out[sc.name] = self.scenario(sc, rounds, meter, tool_argv, remote, spied,
                                                 fs)
        finally:
            # Waited for with fresh file systems: the container's copies of their mounts
            # go with it, before they are unmounted.
            self.cp.kubectl("delete", "pod", POD, "--grace-period=0", "--force",
                            f"--wait={str(self.fresh).lower()}", "--timeout=60s", check=False)
        out["peak_rss_mib"] = {k: round(cg.peak_rss_mib(), 1)
                               for k, (_, _, cg) in pods.groups.items()}
        return out

    def scenario(self, sc: Scenario, rounds: int, meter: Meter,
                 tool_argv: dict[str, list[str]], remote: dict[str, str],
                 spied: dict[str, int], fs: FreshFs) -> dict[str, Any]:
        print(f"bench: {sc.name}: {sc.files} x {sc.file_bytes} bytes, {rounds} round(s)",
              file=sys.stderr, flush=True)
        size = image_bytes(sc.total)
        # The source once per scenario: only read by the transfers.
        src = make_payload(sc, fs.make(f"src-{sc.name}", self.workdir, size)
                           if self.fresh else self.workdir)
        digest = local_digest(src)

        def upload_target(tool: str, r: int) -> str:
            if not self.fresh:
                return f"{remote[tool]}-{sc.name}-r{r}"
            assert self.data is not None
            name = f"up-{sc.name}-{tool.split()[-1]}-r{r}"
            fs.make(name, self.data, size, self.node.ns.exec_prefix())
            self.check_mounted(f"{DATA}/{name}")
            return f"{DATA}/{name}/{sc.name}"  # a new target, as in rootfs

        def download_target(tool: str, r: int) -> Path:
            name = f"back-{sc.name}-{tool.split()[-1]}-r{r}"
            if not self.fresh:
                return self.workdir / name
            return fs.make(name, self.workdir, size) / sc.name
        # Each tool downloads into a directory of its own each round, all removed after
        # the last round: on ext4 without a journal (this VM's root) a file created within
        # minutes of a mass deletion nearby pays a scan past every recently deleted inode
        # (find_inode_bit -> recently_deleted, ~10x the kernel time of a create), so
        # removing one tool's 10,000 files right before the other's download handicapped
        # whichever went second (kubectl cp's first round never was).
        backs: list[Path] = []

        def drop(path: Path) -> None:
            shutil.rmtree(path, ignore_errors=True)
            path.unlink(missing_ok=True)
        secs: dict[str, list[float]] = {}
        unmeasured: dict[str, list[float]] = {}
        cpu: dict[str, dict[str, float]] = {}
        thr: dict[str, dict[str, list[float]]] = {}

        def one(tool: str, way: str, argv: list[str]) -> None:
            key = f"{tool} {way}"
            spy = self.spy if tool == "kubectl ncp" else None
            if spy is not None:  # the client too, started under py-spy (or perf)
                out = spy / f"{sc.name}-{key.replace(' ', '_')}-client"
                argv = (["perf", "record", "-q", "-F", "499", "-o", f"{out}.perf", "--", *argv]
                        if self.perf_only else
                        ["py-spy", "record", "-r", "97", "-n", "-f", "raw", "-o", f"{out}.txt",
                         "--", *argv])
            for attempt in range(1, KCP_ATTEMPTS + 1):
                # Each transfer starts on clean file systems: kubectl cp's tar leaves its
                # files dirty, and the next tool's syncfs (or the kernel's writeback in its
                # window) would otherwise pay for them; this is the order effect of earlier
                # runs, where whichever tool came second was slower on small files.
                os.sync()
                mine0, busy0 = sum(cpu.get(key, {}).values()), machine_busy_s()
                try:  # a failed attempt adds no CPU: window() measures only on success
                    with profiled(spy, f"{sc.name}-{key}", spied, native=False, perf=True,
                                  pyspy=not self.perf_only), \
                            meter.window(cpu.setdefault(key, {}), thr.setdefault(key, {})):
                        took = timed(argv, self.ncp_root if tool == "kubectl ncp" else REPO)
                except SystemExit as exc:
                    # kubectl cp's exec stream drops now and then on a loaded machine
                    # ("unexpected EOF"): run it again rather than lose the whole run.
                    if tool != "kubectl cp" or attempt == KCP_ATTEMPTS:
                        raise
                    print(f"bench: {key} failed (attempt {attempt}), again: {exc}",
                          file=sys.stderr, flush=True)
                    if way == "upload":
                        self.kubectl("exec", POD, "--", BUSYBOX, "rm", "-rf",
                                     argv[-1].rpartition(":")[2])
                    else:
                        drop(Path(argv[-1]))
                    continue
                secs.setdefault(key, []).append(took)
                # The machine's CPU outside the processes measured over the transfer:
                # others' work on these shared cores (and etcd, kernel threads) that
                # slowed it; shown beside each round's seconds.
                unmeasured.setdefault(key, []).append(round(
                    machine_busy_s() - busy0 - (sum(cpu[key].values()) - mine0), 2))
                break

        # Each round uploads to targets of its own, all removed after the last round: a
        # tree removed just before a round would make its first uploader pay for it (on
        # an ext4 without a journal, as here, every new inode skips the ones freed in the
        # last 30 s: ext4's recently_deleted, most of both tools' CPU after a removal).
        # With fresh file systems each is its own (a kubectl cp retry after a failed
        # attempt's removal is the one exception).
        made: list[str] = []
        try:
            for r in range(rounds):
                order = TOOLS if r % 2 == 0 else TOOLS[::-1]
                ups: dict[str, str] = {}
                for tool in order:
                    dst = ups[tool] = upload_target(tool, r)
                    made.append(dst)
                    if sc.is_dir and UPLOAD_SETTLE_S:
                        time.sleep(UPLOAD_SETTLE_S)  # (--settle) see UPLOAD_SETTLE_S
                    one(tool, "upload", [*tool_argv[tool], str(src), f"default/{POD}:{dst}"])
                    got = self.remote_digest(dst, sc.is_dir)
                    if got != digest:
                        raise SystemExit(f"{sc.name} {tool} upload: sha256 mismatch")
                # Both download what kubectl cp wrote: the agent has never hashed it.
                cold = ups["kubectl cp"]
                for tool in order:
                    back = download_target(tool, r)
                    backs.append(back)
                    one(tool, "download", [*tool_argv[tool], f"default/{POD}:{cold}",
                                           str(back)])
                    if local_digest(back) != digest:
                        raise SystemExit(f"{sc.name} {tool} download: sha256 mismatch")
            if not self.fresh:  # fresh ones go whole, unmounted
                self.kubectl("exec", POD, "--", BUSYBOX, "rm", "-rf", *made)
        finally:
            if not self.fresh:
                for back in backs:
                    drop(back)
                if src.is_dir():
                    shutil.rmtree(src)
                else:
                    src.unlink()
        gib = sc.total * rounds / GiB
        best = {k: min(v) for k, v in secs.items()}
        mibs = {k: sc.total / MiB / t for k, t in best.items()}
        per_gib = {k: {p: round(s / gib, 3) for p, s in v.items()} for k, v in cpu.items()}
        totals = {k: sum(v.values()) for k, v in per_gib.items()}
        res: dict[str, Any] = {
            "files": sc.files, "file_bytes": sc.file_bytes, "rounds": rounds,
            "seconds": secs, "unmeasured_cpu_s": unmeasured,
            "MiB_per_s": {k: round(v, 1) for k, v in mibs.items()},
            "cpu_s_per_gib": per_gib,
            "throttled": {k: {p: {"periods": int(n), "seconds": round(s, 3)}
                              for p, (n, s) in v.items()} for k, v in thr.items()}}
        for way, short in (("upload", "up"), ("download", "down")):
            res[f"{short}_ratio"] = round(mibs[f"kubectl ncp {way}"]
                                          / mibs[f"kubectl cp {way}"], 2)
            res[f"{short}_cpu_ratio"] = round(totals[f"kubectl cp {way}"]
                                              / totals[f"kubectl ncp {way}"], 2)
        return res


# --- the cluster: found running, or brought up and taken down again ------------------

def image_archive(suite: str | None = None) -> Path:
    """This checkout's image in an archive of its own (as tests/e2e/addon does), one per
    Debian suite when one is named."""
    tag = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    return IMAGE_ARCHIVE.with_name(f"aggapi-{tag}{f'-{suite}' if suite else ''}.oci.tar")


def suite_image(addon: Addon, suite: str, root: Path = REPO) -> tuple[str, list[str]]:
    """The image of checkout ``root`` on Debian ``suite``, built (hack/build-image.sh
    skips an unchanged one) and imported into every node; its name and the helm values
    that run it in place of the installed one."""
    own = "" if root == REPO else "-" + hashlib.sha256(str(root).encode()).hexdigest()[:8]
    tag = f"dev-{suite}{own}"
    image = f"{IMAGE_REPOSITORY}:{tag}"
    archive = image_archive(suite + own)
    subprocess.run(["bash", str(root / "hack/build-image.sh"), "--suite", suite, "-t", image,
                    "-o", str(archive)], check=True, stdout=subprocess.DEVNULL)
    addon.load_image(archive)
    return image, [f"image.repository={IMAGE_REPOSITORY}", f"image.tag={tag}",
                   "image.digest=", "image.pullPolicy=Never"]


@contextlib.contextmanager
def installed(instance: str, up: bool) -> Iterator[tuple[Cluster, Addon]]:
    cp = ControlPlane(instance=instance)
    started_cp = started_nodes = installed_here = False
    try:
        if not cp.proc("kube-apiserver").alive():
            if not up:
                raise SystemExit(f"no control plane {instance!r}: run hack/local-up.sh "
                                 "or pass --up")
            cp.up()
            started_cp = True
        cluster = Cluster(cp, registry_of(cp))
        if not all(n.proc("kubelet").alive() for n in cluster.nodes):
            if not up:
                raise SystemExit("the two-node cluster is not up: hack/local-up.sh or --up")
            cluster.up()
            started_nodes = True
        addon = addon_of(cluster)
        if not addon.installed():
            if not up:
                raise SystemExit("aggapi is not installed: hack/local-up.sh or --up")
            archive = image_archive()
            subprocess.run(["bash", str(REPO / "hack/build-image.sh"), "-o", str(archive)],
                           check=True, stdout=subprocess.DEVNULL)
            addon.load_image(archive)
            addon.remove_harness_objects()
            installed_here = True
            print(f"bench: {addon.install().line()}", file=sys.stderr, flush=True)
        yield cluster, addon
    finally:
        if started_cp:
            cp.down()  # the nodes with it
        elif started_nodes:
            cluster.down()
        elif installed_here:
            addon.uninstall()


# Seconds to wait before each directory upload (--settle): on an ext4 without a journal
# (this machine's root) every new inode skips those freed in the last 30 s (ext4's
# recently_deleted, which reads each one's inode block), so an upload right after a
# cluster's teardown or another run's clean-up pays for them, whichever tool it is.
UPLOAD_SETTLE_S = 0.0


@dataclass(frozen=True)
class Variant:
    label: str
    sets: tuple[str, ...]  # helm --set values
    ncp_root: Path = REPO  # where the ncp client runs from (a checkout's root)
    suite: str | None = None  # the pods' image built on this Debian suite; None: as is
    src: Path = REPO  # the checkout the pods' image is built from (with suite)


def parse_variant(text: str) -> Variant:
    """``LABEL=K=V,...``: helm ``--set`` values; ``ncp=DIR``: the ncp client run from
    DIR (a checkout's root holding ``aggapi/``) instead of this one; ``suite=SUITE``: the
    pods run this checkout's image built on Debian SUITE; ``src=DIR`` (with ``suite=``):
    that image built from checkout DIR instead. The last of each wins."""
    label, _, spec = text.partition("=")
    sets, own = [], {}
    for s in (s for s in spec.split(",") if s):
        key, _, value = s.partition("=")
        if key in ("ncp", "suite", "src"):
            own[key] = value
        else:
            sets.append(s)
    if "src" in own and not own.get("suite"):
        raise SystemExit(f"variant {label!r}: src= needs suite= (the image to build)")
    return Variant(label, tuple(sets), Path(own["ncp"]).resolve() if "ncp" in own else REPO,
                   own.get("suite") or None,
                   Path(own["src"]).resolve() if "src" in own else REPO)


def machine_busy_s(stat: str | None = None) -> float:
    """CPU seconds every core of the machine has been busy (``cpu`` line of /proc/stat:
    all but idle and iowait; guest time is already in user)."""
    text = stat if stat is not None else Path("/proc/stat").read_text()
    f = [int(x) for x in text.split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = f
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def container_ext4(mounts: str) -> set[str]:
    """The ext4 mount points in a /proc/mounts text (octal escapes as the kernel
    writes them: the bench's own paths have none)."""
    return {f[1] for f in (line.split() for line in mounts.splitlines())
            if len(f) > 2 and f[2] == "ext4"}


def warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_installed(instance: str, up: bool, node_index: int, scs: list[Scenario], rounds: int,
                  variants: list[str], spy: Path | None, perf_only: bool = False,
                  target_fs: str = "fresh") -> dict[str, Any]:
    from benchmarks.tls_floor import floor, floor_in_image, print_floor

    results: dict[str, Any] = {}
    # The bare TLS pair first (a Python sender and receiver over 127.0.0.1), on this
    # host's Python and OpenSSL; a suite= variant's is measured in its image too.
    tls = floor(256 * MiB)
    print_floor(tls)
    with installed(instance, up) as (cluster, addon):
        node = cluster.node(node_index)
        changed = False
        for text in variants or ["as installed="]:
            v = parse_variant(text)
            label, sets, vtls = v.label, list(v.sets), tls
            if v.suite:
                image, image_sets = suite_image(addon, v.suite, v.src)
                sets = [*image_sets, *sets]
                vtls = floor_in_image(image, 256 * MiB)
                print_floor(vtls)
            if sets or changed:  # back to the chart's defaults after another variant
                addon.upgrade(sets)
                addon.wait_ready()
            changed = bool(sets)
            vspy = spy / label if spy else None
            if vspy:
                vspy.mkdir(parents=True, exist_ok=True)
            with tempfile_dir() as workdir:
                r = Bench(cluster, addon, node, workdir, vspy, v.ncp_root,
                          perf_only, target_fs).run(scs, rounds)
            r["sets"] = sets
            r["ncp_from"] = str(v.ncp_root)
            r["tls_floor"] = vtls
            results[label] = r
            report(label, r)
    return results


@contextlib.contextmanager
def tempfile_dir() -> Iterator[Path]:
    import tempfile

    (REPO / ".local").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-kcp-", dir=REPO / ".local") as d:
        yield Path(d)


def report(label: str, r: dict[str, Any]) -> None:
    print(f"== {label} ({os.cpu_count()} CPUs, shared; load {os.getloadavg()[0]:.2f})")
    print(f"  files on {TARGET_FS_TEXT[r['target_fs']]} (--target-fs {r['target_fs']}), "
          f"settle {r['settle_s']:g} s before each directory upload")
    for k, p in r["pods"].items():
        lim = "no limit" if p["cpu_limit"] is None else f"limit {p['cpu_limit']:g} CPU"
        print(f"  {k:26s} {p['pod']} on {p['node']}, {lim}, "
              f"peak RSS {r['peak_rss_mib'].get(k, 0):.0f} MiB")
    for name, sc in r.items():
        if not isinstance(sc, dict) or "MiB_per_s" not in sc:
            continue
        print(f"{name}: {sc['files']} x {sc['file_bytes'] / MiB:g} MiB, best of {sc['rounds']}")
        for k, v in sc["MiB_per_s"].items():
            rounds = " ".join(f"{t:.2f}" for t in sc["seconds"][k])
            others = " ".join(f"{t:.1f}" for t in sc.get("unmeasured_cpu_s", {}).get(k, []))
            print(f"  {k:22s} {v:8.1f} MiB/s  ({min(sc['seconds'][k]):.2f} s; rounds {rounds}; "
                  f"unmeasured CPU-s {others})")
        procs: list[str] = []
        for used in sc["cpu_s_per_gib"].values():
            procs += [p for p in used if p not in procs]
        print("  CPU-s/GiB: " + " | ".join(p for p in procs) + " | total")
        for k, used in sc["cpu_s_per_gib"].items():
            print(f"    {k:22s}" + "".join(f"{used.get(p, 0.0):7.2f}" for p in procs)
                  + f"{sum(used.values()):8.2f}")
        for k, pods in sc["throttled"].items():
            hit = {p: t for p, t in pods.items() if t["periods"]}
            if hit:
                print(f"  throttled in {k}: " + ", ".join(
                    f"{p} {t['periods']}x {t['seconds']:.2f}s" for p, t in hit.items()))
        for way in ("up", "down"):
            goal = GOALS.get(name)
            verdict = ("" if goal is None else
                       f", goal {goal}x: {'met' if sc[f'{way}_ratio'] >= goal else 'NOT met'}")
            print(f"  {way}: ncp/kubectl cp {sc[f'{way}_ratio']:.2f}x throughput, "
                  f"{sc[f'{way}_cpu_ratio']:.2f}x CPU efficiency{verdict}")
        served = [k for k in sc["cpu_s_per_gib"].get("kubectl ncp upload", {})
                  if k.startswith("aggapi apiserver@")]
        for way in ("upload", "download"):
            used = sc["cpu_s_per_gib"].get(f"kubectl ncp {way}", {})
            if served:
                top = max(served, key=lambda k: used.get(k, 0.0))
                node = r["pods"][top]["node"]
                print(f"  ncp {way} served by {r['pods'][top]['pod']} on {node} "
                      f"(its CPU), agent on {r['pods']['agent']['node']}")


def goals(r: dict[str, Any]) -> dict[str, Any]:
    """The --json summary: ratios per scenario and whether the issue's goals are met."""
    out: dict[str, Any] = {name: {"up_ratio": sc["up_ratio"], "down_ratio": sc["down_ratio"],
                                  "up_cpu_ratio": sc["up_cpu_ratio"],
                                  "down_cpu_ratio": sc["down_cpu_ratio"]}
                           for name, sc in r.items()
                           if isinstance(sc, dict) and "up_ratio" in sc}
    out["goal_met"] = all(name in out and min(out[name]["up_ratio"], out[name]["down_ratio"])
                          >= goal for name, goal in GOALS.items())
    return out
