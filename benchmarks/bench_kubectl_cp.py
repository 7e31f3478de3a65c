"""kubectl cp (kube-apiserver -> kubelet exec streaming -> tar in the container) against
our copy (kubectl ncp: kube-apiserver -> aggregator -> aggapi -> agent), same file, same
kube-apiserver, same container, side by side in one run; integrity checked on both.

Needs a running stack with a real kubelet on the instance (hack/local-up.sh, or):

    python3 -m tests.framework.controlplane up && python3 -m tests.framework.node up
    python3 -m tests.framework.kubelet up && python3 -m tests.framework.controlplane start-apiserver

Run: ``python3 -m benchmarks.bench_kubectl_cp [--instance local] [--size-mib 1024]
[--rounds 1]``. The container image is busybox with tar and sha256sum on PATH (kubectl cp
needs tar); the pod is deleted at the end. Prints MiB/s of each, the ratio, and JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.framework import oci
from tests.framework.controlplane import INSTANCES, ControlPlane, binary
from tests.framework.kubelet import pod_manifest
from tests.framework.node import OCI_CACHE, Node
from tests.framework.repo import REPO

POD = "bench-kubectl-cp"
IMAGE_REPO = "aggapi-test/busybox-tar"
MiB = 1 << 20


def push_tar_image(node: Node) -> str:
    cache = oci.BlobCache(OCI_CACHE)
    links = [oci.TarEntry(f"bin/{a}", kind="symlink", target="busybox")
             for a in ("tar", "sha256sum", "ls", "cat", "rm", "mkdir")]
    img = oci.build_image([cache.busybox_layer(), cache.files_layer(links)],
                          cmd=["/bin/busybox", "sleep", "3600"],
                          labels={"io.aggapi.test": IMAGE_REPO})
    oci.push_image(node.info.registry_host, IMAGE_REPO, img, "1")
    return f"{node.info.registry_host}/{IMAGE_REPO}:1"


def make_file(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 * MiB))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def remote_sha(cp: ControlPlane, path: str) -> str:
    out = cp.kubectl("exec", POD, "--", "sha256sum", path).stdout
    return out.split()[0]


def timed(argv: list[str]) -> float:
    t0 = time.monotonic()
    cp = subprocess.run(argv, capture_output=True, text=True, cwd=REPO)
    took = time.monotonic() - t0
    if cp.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])}... failed: {cp.stderr.strip()}")
    return took


def run(cp: ControlPlane, size: int, rounds: int, workdir: Path) -> dict[str, Any]:
    node = Node.load(cp)
    image = push_tar_image(node)
    cp.kubectl("delete", "pod", POD, "--grace-period=0", "--force", "--ignore-not-found",
               check=False)
    cp.kubectl("create", "-f", "-", input=json.dumps(pod_manifest(
        POD, [{"name": "c", "image": image}], node=cp.node_name)))
    cp.kubectl("wait", "--for=condition=Ready", f"pod/{POD}", "--timeout=120s")
    src = workdir / "payload.bin"
    sha = make_file(src, size)
    kc = [binary("kubectl"), f"--kubeconfig={cp.admin_kubeconfig}"]
    results: dict[str, list[float]] = {"kubectl cp": [], "kubectl ncp": []}
    try:
        for _ in range(rounds):
            t = timed([*kc, "cp", str(src), f"default/{POD}:/tmp/kcp.bin"])
            assert remote_sha(cp, "/tmp/kcp.bin") == sha, "kubectl cp: sha256 mismatch"
            results["kubectl cp"].append(t)
            cp.kubectl("exec", POD, "--", "rm", "-f", "/tmp/kcp.bin")
            # ncp checks the server's sha256 itself; check it again from inside.
            t = timed([sys.executable, "-m", "aggapi.plugins.ncp", "-q",
                       f"--kubeconfig={cp.admin_kubeconfig}", str(src),
                       f"default/{POD}:/tmp/ncp.bin"])
            assert remote_sha(cp, "/tmp/ncp.bin") == sha, "ncp: sha256 mismatch"
            results["kubectl ncp"].append(t)
            cp.kubectl("exec", POD, "--", "rm", "-f", "/tmp/ncp.bin")
    finally:
        cp.kubectl("delete", "pod", POD, "--grace-period=0", "--force", "--wait=false",
                   check=False)
    best = {k: min(v) for k, v in results.items()}
    mibs = {k: size / MiB / t for k, t in best.items()}
    return {"size_bytes": size, "rounds": rounds, "sha256": sha,
            "seconds": results, "best_seconds": best,
            "MiB_per_s": {k: round(v, 1) for k, v in mibs.items()},
            "ratio_ncp_over_kubectl_cp": round(mibs["kubectl ncp"] / mibs["kubectl cp"], 2),
            "integrity": "sha256 verified in the container for both"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_kubectl_cp",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instance", default=os.environ.get("AGGAPI_INSTANCE", "local"))
    p.add_argument("--size-mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=1)
    a = p.parse_args(argv)
    if a.instance not in INSTANCES:  # a private instance (tests, development)
        INSTANCES[a.instance] = max(INSTANCES.values()) + 1
    cp = ControlPlane(instance=a.instance)
    with tempfile.TemporaryDirectory(prefix="bench-kcp-", dir=REPO / ".local") as d:
        r = run(cp, a.size_mib * MiB, a.rounds, Path(d))
    for k in ("kubectl cp", "kubectl ncp"):
        print(f"{k:12s} {r['MiB_per_s'][k]:8.1f} MiB/s  ({r['best_seconds'][k]:.1f} s for "
              f"{a.size_mib} MiB)")
    print(f"ratio ncp / kubectl cp: {r['ratio_ncp_over_kubectl_cp']}x  ({r['integrity']})")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
