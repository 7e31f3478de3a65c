"""A HEAD that hashes a 1 GiB file must not slow another tenant's small downloads
(issue 35 item 5).

The real agent (``tests.agent.agentserver.run_agent``: mTLS, capability tokens, the
CRI resolver, its own process, as the tests/agent integration tests run it) on a real
containerd with two runc pods from a local registry: ``hasher`` in namespace
tenant-a holds a 1 GiB file, ``neighbour`` in tenant-b a 4 KiB one. The neighbour
downloads its file over and over, one at a time, as the apiserver calls the agent
(one mTLS connection per download, a fresh capability each). Two phases:

  idle    the neighbour alone
  hashing tenant-a HEADs its 1 GiB file back to back (each with a new ctime, so the
          digest cache never answers: every HEAD hashes the whole file); only the
          neighbour's downloads that started while a HEAD was in flight count

Printed: p50, p95 and max of the neighbour's download times in each phase, the HEADs'
hash rate, and whether the goal (p95 <= 200 ms while hashing) is met. Run as root
(containerd, runc), heavy: ``flock /tmp/aggapi-e2e.lock python3 -m
benchmarks.bench_head_neighbours [--seconds 20] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from aggapi import wire
from aggapi.auth.capability import CapabilitySigner, ContainerRef
from aggapi.runtime.cri import CRIClient
from aggapi.tls import certs
from tests.agent.agentserver import NODE, client_ssl
from tests.framework import oci
from tests.framework.containerd import Containerd
from tests.framework.pods import ContainerSpec, PodRunner, RunningPod
from tests.framework.registry import Registry

GiB = 1 << 30
GOAL_P95_MS = 200.0
BIG = "/tmp/big.bin"
SMALL = "/tmp/small.bin"


async def _agent_child(pki_dir: str, address: str) -> None:
    """The agent's own process: the real app on the real runtime, until killed."""
    from aggapi.agent.copy.quotas import CopyLimits
    from aggapi.runtime.containerd import ContainerdClient
    from tests.agent.agentserver import run_agent
    async with CRIClient(address) as cri, ContainerdClient(address, "k8s.io") as ctd, \
            run_agent(Path(pki_dir), cri=cri, containerd=ctd,
                      copy=CopyLimits(state_dir=str(Path(pki_dir) / "inflight"))) as agent:
        print(agent.url, flush=True)
        await asyncio.Event().wait()


class Caller:
    """Calls the agent as the apiserver does: its client certificate, a capability
    token per request naming the pod, container and path."""

    def __init__(self, url: str, pki_dir: Path) -> None:
        self.url = url
        self.pki = pki_dir
        self.signer = CapabilitySigner((pki_dir / "token-signing.key").read_bytes())

    def headers(self, method: str, pod: RunningPod, path: str) -> dict[str, str]:
        token = self.signer.sign(node=NODE, subject="bench", operation=wire.copy_operation(method),
                                 pod_namespace=pod.namespace, pod_name=pod.name, pod_uid=pod.uid,
                                 containers=[ContainerRef("app", "busybox")], path=path)
        return {"Authorization": f"Bearer {token}"}

    async def call(self, s: aiohttp.ClientSession, method: str, pod: RunningPod, path: str,
                   data: Any = None) -> tuple[int, bytes, dict[str, str]]:
        async with s.request(method, self.url + "/v1/copy", data=data,
                             params={"container": "app", "path": path},
                             headers=self.headers(method, pod, path)) as r:
            body = await r.read()
            return r.status, body, dict(r.headers)

    def session(self, *, fresh: bool = False) -> aiohttp.ClientSession:
        conn = aiohttp.TCPConnector(ssl=client_ssl(self.pki), force_close=fresh)
        return aiohttp.ClientSession(connector=conn,
                                     timeout=aiohttp.ClientTimeout(total=600))


async def _big_body() -> Any:
    block = os.urandom(1 << 20)
    for i in range(GiB >> 20):
        yield i.to_bytes(8, "big") + block[8:]


def _summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in samples)
    if not ms:
        return {"n": 0, "p50_ms": 0.0, "p95_ms": 0.0, "max_ms": 0.0}
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1),
            "p95_ms": round(ms[min(len(ms) - 1, int(0.95 * len(ms)))], 1),
            "max_ms": round(ms[-1], 1)}


async def _neighbour(caller: Caller, pod: RunningPod, until: float,
                     busy: list[tuple[float, float]] | None) -> list[float]:
    """Download the small file back to back until ``until``; the durations (of those
    that started while a HEAD was in flight, when ``busy`` is given)."""
    out: list[tuple[float, float]] = []
    async with caller.session(fresh=True) as s:
        while time.monotonic() < until:
            t0 = time.monotonic()
            status, body, _ = await caller.call(s, "GET", pod, SMALL)
            assert status == 200 and len(body) == 4096, status
            out.append((t0, time.monotonic() - t0))
            await asyncio.sleep(0.01)
    if busy is None:
        return [d for _, d in out]
    return [d for t0, d in out if any(a <= t0 < b for a, b in busy)]


async def _hash_loop(caller: Caller, pod: RunningPod, big_host: Path, until: float,
                     busy: list[tuple[float, float]]) -> int:
    n = 0
    async with caller.session() as s:
        while time.monotonic() < until:
            os.chmod(big_host, 0o644 if n % 2 else 0o640)  # a new ctime: no cached digest
            t0 = time.monotonic()
            status, _, headers = await caller.call(s, "HEAD", pod, BIG)
            assert status == 200 and wire.HEADER_SHA256 in headers, (status, headers)
            busy.append((t0, time.monotonic()))
            n += 1
    return n


async def measure(seconds: float, work: Path) -> dict[str, Any]:
    pki_dir = work / "pki"
    certs.generate(pki_dir)
    with Registry(work / "registry") as reg:
        cache = oci.BlobCache(work / "cache")
        oci.push_image(reg.host, "bench/pause", oci.pause_image(cache), "1")
        oci.push_image(reg.host, "bench/busybox", oci.busybox_image(cache), "1")
        with Containerd(sandbox_image=f"{reg.host}/bench/pause:1") as ctd:
            ctd.add_registry(reg.host)
            async with CRIClient(ctd.address) as cri:
                runner = PodRunner(cri, cgroup_parent=ctd.cgroup_parent,
                                   log_root=ctd.workdir / "pods")
                try:
                    return await _run(seconds, pki_dir, ctd, cri, runner,
                                      f"{reg.host}/bench/busybox:1")
                finally:
                    await runner.remove_all()


async def _run(seconds: float, pki_dir: Path, ctd: Containerd, cri: CRIClient,
               runner: PodRunner, image: str) -> dict[str, Any]:
    spec = [ContainerSpec("app", image)]
    hasher = await runner.run_pod("hasher", spec, namespace="tenant-a")
    neighbour = await runner.run_pod("neighbour", spec, namespace="tenant-b")
    status = await cri.container_status(hasher.containers["app"])
    assert status is not None and status.pid
    big_host = Path(f"/proc/{status.pid}/root{BIG}")
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bench_head_neighbours", "--agent-child",
        str(pki_dir), ctd.address, stdout=asyncio.subprocess.PIPE)
    try:
        assert child.stdout is not None
        url = (await asyncio.wait_for(child.stdout.readline(), 60)).decode().strip()
        caller = Caller(url, pki_dir)
        async with caller.session() as s:
            st, body, _ = await caller.call(s, "POST", hasher, BIG, _big_body())
            assert st == 200, body[:300]
            st, body, _ = await caller.call(s, "POST", neighbour, SMALL, os.urandom(4096))
            assert st == 200, body[:300]
        # Warm up (connections, the page cache of the big file).
        await _neighbour(caller, neighbour, time.monotonic() + 1, None)
        idle = await _neighbour(caller, neighbour, time.monotonic() + seconds, None)
        busy: list[tuple[float, float]] = []
        until = time.monotonic() + seconds
        heads, hashing = await asyncio.gather(
            _hash_loop(caller, hasher, big_host, until, busy),
            _neighbour(caller, neighbour, until, busy))
    finally:
        child.kill()
        await child.wait()
    head_s = [b - a for a, b in busy]
    res: dict[str, Any] = {
        "idle": _summary(idle), "hashing": _summary(hashing), "heads": heads,
        "head_seconds_median": round(statistics.median(head_s), 2) if head_s else None,
        "hash_mib_per_s": round(1024 / statistics.median(head_s), 1) if head_s else None,
        "cores": os.cpu_count()}
    res["goal_met"] = bool(hashing) and res["hashing"]["p95_ms"] <= GOAL_P95_MS
    return res


def report(res: dict[str, Any]) -> None:
    print(f"neighbour's 4 KiB downloads (agent on real containerd, {res['cores']} cores)")
    print(f"{'phase':<28} {'n':>5} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8}")
    for label, key in (("idle", "idle"), ("while a 1 GiB HEAD hashes", "hashing")):
        r = res[key]
        print(f"{label:<28} {r['n']:>5} {r['p50_ms']:>8.1f} {r['p95_ms']:>8.1f} "
              f"{r['max_ms']:>8.1f}")
    print(f"HEADs: {res['heads']}, median {res['head_seconds_median']} s each "
          f"({res['hash_mib_per_s']} MiB/s hashed)")
    print(f"goal p95 <= {GOAL_P95_MS:.0f} ms while hashing: "
          f"{'met' if res['goal_met'] else 'NOT met'}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--agent-child":
        asyncio.run(_agent_child(sys.argv[2], sys.argv[3]))
        return
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    p.add_argument("--json", help="also write the figures here")
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aggapi-bench-head-"))
    try:
        res = asyncio.run(measure(a.seconds, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(res)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
