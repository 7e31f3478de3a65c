"""Copy throughput and memory (issue 5): 1 GiB upload and download, side by side,

  baseline   a raw TLS loopback server that only discards / produces bytes
  agent      the real agent app (aggapi.agent.app.build_app: mTLS + capability token)
             called directly, as the apiserver calls it
  apiserver  ``python3 -m aggapi apiserver`` in front of that agent, client-cert auth
             (a user certificate of the ConfigMap's client CA), TLS end to end
  proxy      the aggregator stand-in (tests.framework.frontproxy) in front of the
             apiserver: plain HTTP client -> proxy, TLS + front-proxy cert -> apiserver
  ncp        (--ncp) the ncp plugin (``python3 -m aggapi.plugins.ncp``, a process per
             transfer, its CPU from rusage) straight at the apiserver, a file on disk
             both ways: the client's own CPU per GiB, without a kube-apiserver

Every server is its own process (peak RSS = its VmHWM); the client (aiohttp, 1 MiB
chunks) is the same for all legs. The agent's "container" is a temp directory (a
resolver returning its dirfd, no CRI), so the figures are the copy path, not overlayfs.
The fake kube-apiserver (pod, EndpointSlice, allow-all SARs) runs in this process.

``BENCH_NCP_PYSPY=DIR`` runs the ncp client under py-spy (its CPU figures then include
py-spy's). ``BENCH_PYSPY=DIR`` attaches py-spy (raw, native) to the agent and the apiserver
during each agent and apiserver transfer: DIR/<leg>-<direction>-<process>.txt, for
``python3 -m benchmarks.pyspy_top``. Legs run interleaved, ``--rounds`` times (default 2);
each reports its best round, as the CPUs are shared. Run: ``python3 -m
benchmarks.bench_copy [--size-mib 1024] [--rounds 2] [--no-proxy]`` (root: the handlers
chown).
Goals: through the apiserver >= 0.5x the baseline; every process's peak RSS < 100 MB;
(issue 15) the agent at most 2.2 CPU-s/GiB uploading and 1.6 downloading, the apiserver's
relay no worse than when the issue was filed (2.7 CPU-s/GiB, its figure for cd58391; an
earlier 1.5 came from another machine, where 9b02952 measured 1.18 up and 1.40 down:
re-measured on this machine kind on 2026-11-26, 9b02952 gave 2.37 and 2.37).
"""

from __future__ import annotations

import argparse
import os
import shutil
import ssl
import sys
import tempfile
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp

from aggapi import eventloop
from aggapi.auth.capability import ContainerRef
from benchmarks._copyclient import (
    Leg,
    _children_cpu,
    _ncp,
    _spying,
    _timed_download,
    _timed_upload,
    ncp_kubeconfig,
)
from benchmarks._copyrig import (
    CHUNK,
    GV,
    NODE,
    PROXY_TOKEN,
    USER,
    apiserver_process,
    endpoint_slice,
    fake_pod,
)
from benchmarks._copyservers import SERVERS, child, front_proxy_process
from benchmarks._procstats import cpu_seconds, peak_rss_mib, rss_mib


async def run(size: int, work: Path, with_proxy: bool, rounds: int,
              with_ncp: bool = False) -> dict[str, Any]:
    p, root, pod_uid, kube, signer = await fake_pod(work)
    # Baseline: same kind of TLS (a leaf of aggapi's CA for 127.0.0.1) and client.
    base_ctx = ssl.create_default_context(cafile=p.path("ca.crt"))

    def token(op: str, path: str) -> str:
        return signer.sign(node=NODE, subject=USER, operation=op, pod_namespace="default",
                           pod_name="box", pod_uid=pod_uid,
                           containers=(ContainerRef("app", "busybox"),), path=path)

    results: dict[str, dict[str, float]] = {}
    sessions: list[aiohttp.ClientSession] = []
    pids: dict[str, int] = {}

    def session(url: str, ctx: ssl.SSLContext | None) -> aiohttp.ClientSession:
        s = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=ctx or False),
                                  timeout=aiohttp.ClientTimeout(total=None))
        sessions.append(s)
        return s

    cpu: dict[tuple[str, str], dict[str, float]] = {}  # (leg, dir) -> process -> CPU s

    async def cpu_of(leg: Leg, direction: str, transfer: Coroutine[Any, Any, float]) -> float:
        procs = {**pids, "client": os.getpid()}
        async with _spying(leg.name, direction, pids):
            before = {k: cpu_seconds(v) for k, v in procs.items()}
            ncp0 = _children_cpu()
            took = await transfer
        used = cpu.setdefault((leg.name, direction), {})
        for k, v in procs.items():
            used[k] = used.get(k, 0.0) + (cpu_seconds(v) - before[k]) / rounds
        if leg.name == "ncp":  # the client is the ncp process, not this one
            used["client"] = used.get("client", 0.0) + (_children_cpu() - ncp0) / rounds
        return took

    local = work / "payload.bin"
    if with_ncp:
        with local.open("wb") as f:
            for _ in range(size // CHUNK):
                f.write(os.urandom(CHUNK))

    def as_if_written_elsewhere(file: str) -> None:
        """As if the container had just written the file: a new ctime, so the agent's
        digest cache (seeded by the upload) does not spare the download the whole-file
        sha256 a file from anywhere else costs; and every page in the page cache,
        whether or not the upload went through it (O_DIRECT), so the download's
        figures do not depend on how the upload wrote."""
        target = root / file.lstrip("/")
        os.utime(target)
        with target.open("rb") as f:
            while f.read(CHUNK):
                pass

    async def measure(leg: Leg) -> None:
        file = f"/big-{leg.name}"
        if leg.name == "ncp":
            remote = f"default/box:{file}"
            spy = os.environ.get("BENCH_NCP_PYSPY")  # a directory: profile the ncp client
            up = await cpu_of(leg, "upload", _ncp(leg.path, str(local), remote,
                                                  spy and f"{spy}/ncp-upload.txt"))
            as_if_written_elsewhere(file)
            down = await cpu_of(leg, "download", _ncp(leg.path, remote, str(work / "back"),
                                                      spy and f"{spy}/ncp-download.txt"))
            os.unlink(work / "back")
        else:
            up = await cpu_of(leg, "upload", _timed_upload(leg, size, file))
            if leg.path:
                as_if_written_elsewhere(file)
            down = await cpu_of(leg, "download", _timed_download(leg, size, file))
        mib = size / (1 << 20)
        best = results.setdefault(leg.name, {"upload_MiB_s": 0.0, "download_MiB_s": 0.0})
        best["upload_MiB_s"] = max(best["upload_MiB_s"], mib / up)
        best["download_MiB_s"] = max(best["download_MiB_s"], mib / down)
        if leg.path:
            os.unlink(root / file.lstrip("/"))
        print(f"  {leg.name}: up {mib / up:.0f} MiB/s, down {mib / down:.0f} MiB/s",
              file=sys.stderr, flush=True)

    path = f"{GV}/watch/namespaces/default/pods/box/copy"
    try:
        async with AsyncExitStack() as stack:
            burl, bpid = await stack.enter_async_context(
                child("baseline", p.path("apiserver.crt"), p.path("apiserver.key")))
            aurl, apid = await stack.enter_async_context(
                child("agent", str(p.dir), str(root), str(work / "state"), pod_uid))
            kube.put("apis/discovery.k8s.io/v1", "endpointslices",
                     endpoint_slice(int(aurl.rsplit(":", 1)[1])))
            url, api = await stack.enter_async_context(apiserver_process(p, kube, work))
            pids.update({"baseline_server": bpid, "agent": apid, "apiserver": api.pid})
            legs = [Leg("baseline", session(burl, base_ctx), "", {}),
                    Leg("agent", session(aurl, p.agent_client_ssl()), "/v1/copy", {}, token),
                    Leg("apiserver", session(url, p.user_ssl()), path, {})]
            if with_proxy:
                purl, pids["proxy"] = await stack.enter_async_context(
                    front_proxy_process(p, url))
                legs.append(Leg("proxy", session(purl, None), path,
                                {"Authorization": f"Bearer {PROXY_TOKEN}"}))
            if with_ncp:  # path: the kubeconfig
                legs.append(Leg("ncp", legs[0].session, ncp_kubeconfig(p, work, url), {}))
            idle = {k: rss_mib(v) for k, v in pids.items()}
            # Legs interleaved, rounds repeated: on shared CPUs each leg keeps its best.
            for _ in range(rounds):
                for leg in legs:
                    await measure(leg)
            peak = {k: peak_rss_mib(v) for k, v in pids.items()}
    finally:
        for s in sessions:
            await s.close()
        await kube.stop()
    peak["client (this process)"] = peak_rss_mib()
    gib = size / (1 << 30)
    cpu_per_gib = {f"{leg} {d}": {k: v / gib for k, v in used.items() if v > 0.005 * gib}
                   for (leg, d), used in cpu.items()}
    return {"throughput": results, "peak_rss_mib": peak, "idle_rss_mib": idle,
            "cpu_s_per_gib": cpu_per_gib}


def report(size_mib: int, rounds: int, res: dict[str, Any]) -> None:
    thr: dict[str, dict[str, float]] = res["throughput"]
    base = thr["baseline"]
    print(f"copy of {size_mib} MiB, 1 MiB client chunks, 127.0.0.1, {os.cpu_count()} CPUs "
          f"(shared), best of {rounds} interleaved round(s)")
    print(f"{'leg':>10} {'upload MiB/s':>13} {'x base':>7} {'download MiB/s':>15} "
          f"{'x base':>7}")
    for name, r in thr.items():
        print(f"{name:>10} {r['upload_MiB_s']:>13.0f} "
              f"{r['upload_MiB_s'] / base['upload_MiB_s']:>7.2f} "
              f"{r['download_MiB_s']:>15.0f} "
              f"{r['download_MiB_s'] / base['download_MiB_s']:>7.2f}")
    print("peak RSS (VmHWM), MiB: " + ", ".join(
        f"{k} {v:.1f}" for k, v in res["peak_rss_mib"].items()))
    print("RSS before the first transfer (VmRSS), MiB: " + ", ".join(
        f"{k} {v:.1f}" for k, v in res["idle_rss_mib"].items()))
    # Every process on the path pays for TLS (and the agent for the disk) per byte; on
    # a machine of N cores no leg can beat N / (its CPU-seconds per GiB) GiB/s.
    cores = os.cpu_count() or 1
    print(f"CPU-seconds per GiB moved (mean of rounds), and the ceiling that puts on "
          f"{cores} cores:")
    for leg_dir, used in res["cpu_s_per_gib"].items():
        total = sum(used.values())
        # With a core for each process (a real cluster: client, kube-apiserver, aggapi and
        # the agent on different machines), the busiest process sets the pace instead.
        busiest = max(used.items(), key=lambda kv: kv[1])
        print(f"  {leg_dir:>20}: " + ", ".join(f"{k} {v:.2f}" for k, v in used.items())
              + f"; total {total:.2f} -> ceiling {1024 * cores / total:.0f} MiB/s here, "
              f"{1024 / busiest[1]:.0f} MiB/s with a core each ({busiest[0]})")
    api = thr.get("apiserver")
    if api:
        ratio = min(api["upload_MiB_s"] / base["upload_MiB_s"],
                    api["download_MiB_s"] / base["download_MiB_s"])
        servers = {k: v for k, v in res["peak_rss_mib"].items() if not k.startswith("client")}
        print(f"goal apiserver >= 0.5x baseline: worst {ratio:.2f}x -> "
              f"{'met' if ratio >= 0.5 else 'NOT met'}")
        # Issue 15: the agent's own CPU per GiB (called directly), and the relay no worse
        # than the "today" (see the docstring for why not 1.5).
        cpu_goals = (("agent upload", "agent", 2.2), ("agent download", "agent", 1.6),
                     ("apiserver upload", "apiserver", 2.7),
                     ("apiserver download", "apiserver", 2.7))
        for leg_dir, proc, limit in cpu_goals:
            got = res["cpu_s_per_gib"].get(leg_dir, {}).get(proc)
            if got is not None:
                print(f"goal {proc} CPU on {leg_dir} <= {limit} CPU-s/GiB: {got:.2f} -> "
                      f"{'met' if got <= limit else 'NOT met'}")
        worst = max(servers.items(), key=lambda kv: kv[1])
        print(f"goal peak RSS < 100 MB (95.4 MiB): worst {worst[0]} {worst[1]:.1f} MiB -> "
              f"{'met' if worst[1] < 100e6 / (1 << 20) else 'NOT met'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--no-proxy", action="store_true", help="skip the front-proxy leg")
    ap.add_argument("--ncp", action="store_true",
                    help="add the ncp plugin (client CPU per GiB) straight at the apiserver")
    ap.add_argument("--rounds", type=int, default=2,
                    help="all legs again, interleaved; each leg reports its best round")
    ap.add_argument("--serve", nargs="+", metavar=("KIND", "ARG"),
                    help=argparse.SUPPRESS)  # internal: run one server (a child process)
    args = ap.parse_args()
    if args.serve:
        eventloop.run(SERVERS[args.serve[0]](*args.serve[1:]))
        return
    work = Path(tempfile.mkdtemp(prefix="bench-copy-"))
    try:
        res = eventloop.run(run(args.size_mib << 20, work, not args.no_proxy, args.rounds,
                                args.ncp))
        report(args.size_mib, args.rounds, res)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
