"""Progress-engine benchmark against real containerd: containerd RPCs per second
with 1 and with 1,000 subscribers (they must be equal), and the agent's CPU and
RSS with 1,000 subscribers during a throttled pull.

    python3 -m benchmarks.bench_agent_progress [--subscribers 1000] [--mib 96]

Needs root, containerd, runc and docker-registry (as the integration tests).
Subscribers run in-process and consume every update they get through the same
view code the HTTP handler uses (objects + JSON encoding), so CPU figures are the
engine, the fan-out and the encoding, without TLS/HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
import tempfile
import time
from pathlib import Path

from aggapi.agent.progress import view
from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.agent.progress.poller import ProgressPoller, Subscription
from aggapi.auth.capability import ContainerRef
from benchmarks._procstats import rss_mib
from tests.framework import oci
from tests.framework.containerd import Containerd
from tests.framework.registry import Registry
from tests.framework.throttle import ThrottleProxy


async def consume(sub: Subscription, ref: str, counter: list[int]) -> None:
    containers = [ContainerRef("app", ref)]
    while True:
        state = await sub.next()
        if state is None:
            continue
        for o in view.objects(containers, state, "layer"):
            json.dumps(o)
        counter[0] += 1


async def run(ctd: Containerd, ref: str, subscribers: int, throttle: ThrottleProxy,
              rate: int) -> dict[str, float]:
    async with ctd.containerd_client() as client, ctd.cri_client() as cri:
        for img in await cri.list_images():
            if ref in img.repo_tags:
                await cri.remove_image(img.id)
        backend = ContainerdBackend(client, Platform.host(), snapshotter=ctd.snapshotter)
        poller = ProgressPoller(backend, 0.25)
        counter = [0]
        subs = [poller.subscribe([ref]) for _ in range(subscribers)]
        tasks = [asyncio.create_task(consume(s, ref, counter)) for s in subs]
        throttle.set_rate(rate)
        pull = asyncio.create_task(cri.pull_image(ref))
        await asyncio.sleep(1.0)  # let the pull get going
        rpc0, polls0, t0 = client.rpc_count, poller.polls, time.monotonic()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        await asyncio.sleep(4.0)
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        rpc1, polls1, t1 = client.rpc_count, poller.polls, time.monotonic()
        rss = rss_mib()
        still_pulling = not pull.done()
        throttle.set_rate(None)
        await pull
        for t in tasks:
            t.cancel()
        for s in subs:
            s.close()
        await poller.close()
        secs = t1 - t0
        cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / secs
        return {"rpc_per_s": (rpc1 - rpc0) / secs, "polls_per_s": (polls1 - polls0) / secs,
                "rpc_per_poll": (rpc1 - rpc0) / max(polls1 - polls0, 1),
                "cpu_percent": 100 * cpu, "rss_mib": rss, "updates": counter[0],
                "measured_during_pull": float(still_pulling)}


async def main_async(a: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="aggapi-bench-"))
    try:
        await measure(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def measure(a: argparse.Namespace, work: Path) -> None:
    with Registry(work / "registry") as reg:
        cache = oci.BlobCache(work / "cache")
        layers = [cache.random_layer((a.mib << 20) // 3, seed=f"bench-{i}") for i in range(3)]
        oci.push_image(reg.host, "bench/big", oci.build_image(layers), "1")
        pause = oci.pause_image(cache)
        oci.push_image(reg.host, "bench/pause", pause, "1")
        with Containerd(sandbox_image=f"{reg.host}/bench/pause:1") as ctd, \
                ThrottleProxy(reg.host) as proxy:
            ctd.add_registry(reg.host)
            ctd.add_registry(proxy.host)
            ref = f"{proxy.host}/bench/big:1"
            rate = a.rate_mib << 20
            results = {}
            for n in (1, a.subscribers):
                results[n] = await run(ctd, ref, n, proxy, rate)
    print(f"pull of {a.mib} MiB through a {a.rate_mib} MiB/s throttle, poll interval 0.25 s")
    print(f"{'subscribers':>11} {'rpc/s':>7} {'polls/s':>7} {'rpc/poll':>8} "
          f"{'cpu %':>6} {'rss MiB':>8} {'updates':>8}")
    for n, r in results.items():
        print(f"{n:>11} {r['rpc_per_s']:>7.1f} {r['polls_per_s']:>7.2f} "
              f"{r['rpc_per_poll']:>8.2f} {r['cpu_percent']:>6.1f} {r['rss_mib']:>8.1f} "
              f"{r['updates']:>8}" + ("" if r["measured_during_pull"] else "  (pull ended early)"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--subscribers", type=int, default=1000)
    p.add_argument("--mib", type=int, default=96, help="image size")
    p.add_argument("--rate-mib", type=int, default=8, help="throttle, MiB/s")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
