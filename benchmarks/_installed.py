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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks._kcpbench import DATA, Bench, bench_pod, container_ext4
from benchmarks._kcpcluster import installed, parse_variant, suite_image
from benchmarks._kcpmeter import machine_busy_s
from benchmarks._kcpreport import goals, report
from benchmarks._kcpscenarios import MiB, Scenario, local_digest, scenarios, tree_digest
from tests.framework.repo import REPO

# Re-exported for bench_kubectl_cp and the tests, which import them from here. The knobs
# UPLOAD_SETTLE_S and profiled are not: they are read in benchmarks._kcpbench, set them there.
__all__ = ["DATA", "REPO", "bench_pod", "container_ext4", "goals", "local_digest",
           "machine_busy_s", "parse_variant", "run_installed", "scenarios", "tree_digest"]


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
