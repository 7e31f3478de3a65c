"""``bench_kubectl_cp --installed``: one run of every scenario against one chart
variant, both tools side by side (see :mod:`benchmarks._installed`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._busyboxtar import push_tar_image
from benchmarks._freshfs import FreshFs, fresh_fs, image_bytes
from benchmarks._kcpmeter import Meter, Pods, machine_busy_s, python_pids
from benchmarks._kcpscenarios import (
    TARGET_FS_TEXT,
    GiB,
    MiB,
    Scenario,
    local_digest,
    make_payload,
    tree_digest,
)
from benchmarks._procstats import profiled, timed
from tests.framework.addon import Addon
from tests.framework.cluster import Cluster
from tests.framework.clusternode import ClusterNode
from tests.framework.controlplane import binary
from tests.framework.kubelet import pod_manifest
from tests.framework.repo import REPO

TOOLS = ("kubectl cp", "kubectl ncp")
KCP_ATTEMPTS = 3  # kubectl cp runs per transfer before the bench gives up
BUSYBOX = "/bin/busybox"
POD = "bench-kubectl-cp"
TARGET_FS = ("fresh", "rootfs")  # --target-fs: see benchmarks._installed's docstring
DATA = "/data"  # the pod's volume of fresh file systems (--target-fs fresh)
SHARED_ROOT = Path("/var/lib/aggapi-bench")  # its host directories, one per run

# Seconds to wait before each directory upload (--settle): on an ext4 without a journal
# (this machine's root) every new inode skips those freed in the last 30 s (ext4's
# recently_deleted, which reads each one's inode block), so an upload right after a
# cluster's teardown or another run's clean-up pays for them, whichever tool it is.
UPLOAD_SETTLE_S = 0.0


def container_ext4(mounts: str) -> set[str]:
    """The ext4 mount points in a /proc/mounts text (octal escapes as the kernel
    writes them: the bench's own paths have none)."""
    return {f[1] for f in (line.split() for line in mounts.splitlines())
            if len(f) > 2 and f[2] == "ext4"}


def warn(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


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
