"""``bench_scale --replay``: the real aggapi apiserver replicas, each its own process as
the chart runs them (``--leader-elect``: a Lease elects the one that computes the
collections; the others forward to it), fed by ``benchmarks._replay_world`` (a fake
kube-apiserver's pod and event watches, hollow agents whose pulls progress), with no
etcd, kubelet or kwok. Watchers (``benchmarks._replay_clients``) list and watch every
podimagepull through a front proxy per replica (the aggregator's authentication path:
its client certificate and X-Remote-* headers), each request to a replica at random.
Midway the leader is rolled (SIGTERM, as a rolling update; started again after). The
pulls start over ``--rollout`` s (bench_scale's default: 200 a second at 50,000 pods).

Measures: ``first_list_s`` (the first complete list of all namespaces, once every
replica is ready: /readyz waits for the leader's build or a follower's mirror), and
``rollout_list_s`` (one list in the rollout's thick, the leader busy), ``update_p99_s``
(from kubelet's Pulled Event, written when the agent's pull ends, to the Done at the
watchers), each replica's CPU (mean over the run) and peak RSS, and per watcher,
against a fresh list once settled, ``lost_events`` and ``duplicate_events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from aggapi.tls import certs, pki
from benchmarks._procstats import MiB, cpu_seconds, profiled, status_bytes
from benchmarks._replay_clients import Replicas, Watcher, settle, timed_list
from benchmarks._replay_report import by_window, done_times, dump_watchers, pct, report
from tests.framework.frontproxy import FrontProxy, ProxyUser
from tests.framework.procs import free_port, stop_child
from tests.framework.repo import python_env

REPLICA_TOKEN = "replay-replica-token"
CLIENT_TOKEN = "replay-client-token"
LEASE = "/apis/coordination.k8s.io/v1/namespaces/aggapi/leases/aggapi-collections"


class Aggregator(FrontProxy):
    """The front proxy, answering as kube-apiserver's aggregator does when the replica
    behind it is gone (a 503 Status, not an error page)."""

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        try:
            return await super()._forward(request)
        except aiohttp.ClientConnectorError as exc:  # (a stream cut midway stays cut)
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 503,
                                      "status": "Failure", "reason": "ServiceUnavailable",
                                      "message": f"backend unavailable: {exc}"}, status=503)


@dataclass
class Replica:
    index: int
    port: int
    proc: subprocess.Popen[bytes] | None = None
    # per process (a rolled replica is two): pid -> [cpu at start, t start, cpu, t]
    cpu: dict[int, list[float]] = field(default_factory=dict)
    rss_peak: int = 0
    cores_peak: float = 0.0


class Stack:
    def __init__(self, d: Path, args: Any) -> None:
        self.d, self.args = d, args
        self.pki = d / "pki"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.world: subprocess.Popen[bytes] | None = None
        self.kube = ""
        self.agent_port = free_port()
        self.replicas = [Replica(i, free_port()) for i in range(args.replicas)]
        self.world_use = Replica(-1, 0)  # the world's CPU: is the harness the limit?
        self.proxies: list[FrontProxy] = []

    # --- bring-up ----------------------------------------------------------------------
    def make_pki(self) -> None:
        certs.generate(self.pki, ips=["127.0.0.1"])
        fp_ca, client_ca = pki.new_ca("front-proxy-ca"), pki.new_ca("client-ca")
        pki.issue(fp_ca, "front-proxy-client", client=True).write(
            self.pki / "front-proxy-client.crt", self.pki / "front-proxy-client.key")
        (self.d / "auth-configmap.json").write_text(json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication",
                         "namespace": "kube-system"},
            "data": {"client-ca-file": client_ca.cert_pem.decode(),
                     "requestheader-client-ca-file": fp_ca.cert_pem.decode(),
                     "requestheader-allowed-names": json.dumps(["front-proxy-client"]),
                     "requestheader-username-headers": json.dumps(["X-Remote-User"]),
                     "requestheader-uid-headers": json.dumps(["X-Remote-Uid"]),
                     "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
                     "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"])}}))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (self.d / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True,
                                    env=python_env())
        self.procs.append(proc)
        return proc

    async def start_world(self) -> None:
        a = self.args
        self.world = self._spawn("world", [
            sys.executable, "-m", "benchmarks._replay_world", f"--dir={self.d}",
            f"--nodes={a.nodes}", f"--pods={a.pods}", f"--namespaces={a.namespaces}",
            f"--agent-port={self.agent_port}", f"--replica-token={REPLICA_TOKEN}",
            f"--rollout={a.rollout}", f"--seed={a.seed}"])
        ready = self.d / "world.json"
        while not ready.exists():
            if self.world.poll() is not None:
                raise RuntimeError(f"the world exited: {self._tail('world')}")
            await asyncio.sleep(0.2)
        self.kube = json.loads(ready.read_text())["kube"]
        (self.d / "kubeconfig").write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "replay",
            "clusters": [{"name": "replay", "cluster": {"server": self.kube}}],
            "users": [{"name": "replica", "user": {"token": REPLICA_TOKEN}}],
            "contexts": [{"name": "replay", "context": {"cluster": "replay",
                                                        "user": "replica"}}]}))

    def _tail(self, name: str) -> str:
        p = self.d / f"{name}.log"
        return p.read_text(errors="replace")[-2000:] if p.exists() else ""

    def start_replica(self, r: Replica) -> None:
        c = self.pki
        r.proc = self._spawn(f"replica-{r.index}", [
            sys.executable, "-m", "aggapi", "apiserver", "--bind-address=127.0.0.1",
            f"--secure-port={r.port}", f"--tls-cert-file={c / 'apiserver.crt'}",
            f"--tls-private-key-file={c / 'apiserver.key'}",
            f"--kubeconfig={self.d / 'kubeconfig'}", f"--agent-ca-file={c / 'ca.crt'}",
            f"--agent-client-cert-file={c / 'agent-client.crt'}",
            f"--agent-client-key-file={c / 'agent-client.key'}",
            f"--token-signing-key-file={c / 'token-signing.key'}",
            "--agent-namespace=aggapi", "--agent-service=aggapi-agent",
            "--agent-pod-check=false", "--leader-elect", "--pod-namespace=aggapi",
            f"--pod-name=replica-{r.index}", "--advertise-address=127.0.0.1",
            "--shutdown-delay=5",  # the chart's apiserver.shutdownDelaySeconds
            "--log-level=warning", *getattr(self.args, "replica_arg", ())])

    def readyz(self, r: Replica) -> bool:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{r.port}/readyz", context=ctx,
                                        timeout=5) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    async def wait_ready(self, r: Replica, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while not await asyncio.to_thread(self.readyz, r):
            if r.proc is None or r.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"replica {r.index} not ready: "
                                   f"{self._tail(f'replica-{r.index}')}")
            await asyncio.sleep(0.3)

    def leader(self) -> int | None:
        try:
            with urllib.request.urlopen(self.kube + LEASE, timeout=5) as resp:
                holder = str(json.loads(resp.read())["spec"].get("holderIdentity") or "")
        except (OSError, KeyError, ValueError):
            return None
        name = holder.rsplit("_", 1)[0]
        return int(name.removeprefix("replica-")) if name.startswith("replica-") else None

    async def start_proxies(self) -> list[str]:
        users = {CLIENT_TOKEN: ProxyUser("replay-client", groups=("system:authenticated",))}
        for r in self.replicas:
            proxy = Aggregator(f"https://127.0.0.1:{r.port}",
                               client_cert=str(self.pki / "front-proxy-client.crt"),
                               client_key=str(self.pki / "front-proxy-client.key"),
                               backend_ca=str(self.pki / "ca.crt"), users=users)
            await proxy.start()
            self.proxies.append(proxy)
        return [p.url for p in self.proxies]

    async def sample(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            now = time.monotonic()
            self.world_use.proc = self.world
            for r in (*self.replicas, self.world_use):
                pid = r.proc.pid if r.proc is not None and r.proc.poll() is None else None
                if pid is None:
                    continue
                with contextlib.suppress(OSError):
                    cpu = cpu_seconds(pid)
                    rec = r.cpu.setdefault(pid, [cpu, now, cpu, now])
                    if now > rec[3]:
                        r.cores_peak = max(r.cores_peak, (cpu - rec[2]) / (now - rec[3]))
                    rec[2], rec[3] = cpu, now
                    r.rss_peak = max(r.rss_peak, status_bytes(pid).get("VmRSS", 0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)

    async def endpoints(self, replicas: Replicas, stop: asyncio.Event) -> None:
        """Route only to ready replicas, as kube-apiserver's aggregator does once the
        EndpointSlice says a terminating pod is not ready (read every 0.5 s here)."""
        while not stop.is_set():
            replicas.ready = list(await asyncio.gather(
                *(asyncio.to_thread(self.readyz, r) for r in self.replicas)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.5)

    async def down(self) -> None:
        for p in self.proxies:
            await p.stop()
        for proc in reversed(self.procs):
            await asyncio.to_thread(stop_child, proc, 20.0)


async def run(d: Path, args: Any) -> dict[str, Any]:
    st = Stack(d, args)
    st.make_pki()
    t_up = time.monotonic()
    stop_sampling = asyncio.Event()
    watchers: list[Watcher] = []
    tasks: list[asyncio.Task[Any]] = []
    replicas: Replicas | None = None
    world: dict[str, Any] = {}
    try:
        await st.start_world()
        for r in st.replicas:
            st.start_replica(r)
        for r in st.replicas:
            await st.wait_ready(r)
        while await asyncio.to_thread(st.leader) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        urls = await st.start_proxies()
        up_s = time.monotonic() - t_up
        print(f"up in {up_s:.1f}s: {args.pods} pods on {args.nodes} nodes, leader "
              f"replica-{st.leader()}", flush=True)
        replicas = Replicas(urls, CLIENT_TOKEN, args.seed)
        sampler = asyncio.gather(st.sample(stop_sampling),
                                 st.endpoints(replicas, stop_sampling))
        spy = contextlib.ExitStack()
        spy.enter_context(profiled(getattr(args, "py_spy", None), "replay", {
            f"replica-{r.index}": r.proc.pid for r in st.replicas if r.proc is not None},
            native=False))
        t0 = time.monotonic()
        first_list_s, code, first_items, attempts = await timed_list(replicas)
        print(f"first list: {code}, {first_items} items in {first_list_s:.2f}s "
              f"({attempts} attempts)", flush=True)
        # Half list then watch, half stream their list (client-go's two informers).
        watchers = [Watcher(replicas, args.seed + 10 + i, streaming=i % 2 == 1)
                    for i in range(args.watchers)]
        tasks = [asyncio.create_task(w.run()) for w in watchers]
        # The rollout starts once every watcher holds its list: its changes come as
        # updates (a cold list of 50,000 outlasted the whole rollout).
        while not all(w.tally.lists for w in watchers) and time.monotonic() - t0 < 180:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        watchers_listed_s = time.monotonic() - t0
        print(f"every watcher listed after {watchers_listed_s:.1f}s; the rollout starts",
              flush=True)
        assert st.world is not None
        os.kill(st.world.pid, signal.SIGUSR1)  # the rollout's clock starts
        t0 = time.monotonic()
        rolled: dict[str, Any] = {}
        deadline = t0 + args.rollout + 5 + 10 + args.timeout
        roll_at = t0 + 5 + args.rollout / 2
        next_print = t0 + 15
        # A list in the rollout's thick, before the roll (the leader busy): warm, timed.
        busy_list = asyncio.create_task(timed_list(replicas, 5 + args.rollout / 4))
        while len(done_times(d / "done.log")) < args.pods and time.monotonic() < deadline:
            if args.roll and not rolled and time.monotonic() >= roll_at:
                rolled = await roll(st, t0)
            await asyncio.sleep(1.0)
            if time.monotonic() >= next_print:
                next_print += 15
                seen = min(sum(1 for t in w.tally.done_at.values()) for w in watchers)
                print(f"  {time.monotonic() - t0:5.0f}s: {len(done_times(d / 'done.log'))} "
                      f"pulls done, each watcher saw >= {seen} Done", flush=True)
        rollout_s = time.monotonic() - t0
        busy_list_s, _, busy_items, _ = await busy_list
        settled, fresh = await settle(replicas, watchers, args.settle,
                                      len(done_times(d / "done.log")))
        spy.close()
        stop_sampling.set()
        await sampler
        wall = time.monotonic() - t0
        with contextlib.suppress(OSError, ValueError):
            world = json.loads((d / "world.stats").read_text())
        done = done_times(d / "done.log")
        dump_watchers(d / "watchers.json", t0, urls, watchers)
        timed = [(done[k], t - done[k]) for w in watchers
                 for k, t in w.tally.done_at.items() if t > 0 and k in done]
        lat = [x for _, x in timed]
        cpu_means = [(rec[2] - rec[0]) / (rec[3] - rec[1])
                     for r in st.replicas for rec in r.cpu.values() if rec[3] > rec[1]]
        world_cpu = [(rec[2] - rec[0]) / (rec[3] - rec[1])
                     for rec in st.world_use.cpu.values() if rec[3] > rec[1]]
        return {
            "nodes": args.nodes, "pods": args.pods, "replicas": args.replicas,
            "rollout_over_s": args.rollout, "namespaces": args.namespaces,
            "watchers": args.watchers, "up_s": round(up_s, 1),
            "first_list_s": round(first_list_s, 3), "first_list_status": code,
            "first_list_attempts": attempts, "first_list_items": first_items,
            "watchers_listed_s": round(watchers_listed_s, 1),
            "rollout_list_s": busy_list_s, "rollout_list_items": busy_items,
            "pulls_done": len(done),
            "rollout_s": round(rollout_s, 1), "run_s": round(wall, 1),
            "update_samples": len(lat), "update_p50_s": pct(lat, 0.5),
            "update_p99_s": pct(lat, 0.99), "update_max_s": pct(lat, 1.0),
            "replica_cpu_mean_max": round(max(cpu_means, default=0.0), 3),
            "replica_cpu_means": [round(c, 3) for c in cpu_means],
            "replica_cpu_peak_max": round(max(r.cores_peak for r in st.replicas), 3),
            "replica_rss_peak_mib_max": round(max(r.rss_peak for r in st.replicas) / MiB, 1),
            "replica_rss_peak_mib": [round(r.rss_peak / MiB, 1) for r in st.replicas],
            "lost_events": sum(w.tally.lost(fresh) for w in watchers) if fresh else None,
            "duplicate_events": sum(w.tally.duplicates for w in watchers),
            "settled": settled, "watch_events": sum(w.tally.events for w in watchers),
            "watcher_lists": [w.tally.lists for w in watchers],
            "watcher_410s": [w.gone for w in watchers],
            "watch_gap_max_s": [round(w.tally.gap_max, 2) for w in watchers],
            # Done in each cache at the end, and Dones seen with a latency: settled
            # compares versions only, so a phase other than Done would pass it.
            "watcher_done_final": [sum(p == "Done" for _, p in w.tally.cache.values())
                                   for w in watchers],
            "watcher_done_timed": [sum(t > 0 for t in w.tally.done_at.values())
                                   for w in watchers],
            "watcher_errors": [w.errors for w in watchers], "rolled": rolled,
            # [s after the rollout's start, samples, p50, p99, max] by when pulls ended
            "update_by_5s": by_window(timed, t0),
            "agent_polls_per_s": round(world.get("agent_polls", 0) / wall, 1),
            "world_cpu_mean": round(max(world_cpu, default=0.0), 3),
            "world_cpu_peak": round(st.world_use.cores_peak, 3),
            "fake_kube_writes": world.get("writes"),
        }
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if replicas is not None:
            await replicas.close()
        stop_sampling.set()
        await st.down()


async def roll(st: Stack, rollout_t0: float) -> dict[str, Any]:
    """SIGTERM the leader (it releases the Lease, as in a rolling update), start it
    again; how long until another led and until it was back."""
    # The Lease is read in a thread: a blocking read here stalled every watcher of
    # this process (they share its event loop) for as long as the world answered.
    i = await asyncio.to_thread(st.leader)
    if i is None:
        return {"error": "no leader"}
    r = st.replicas[i]
    assert r.proc is not None
    t0 = time.monotonic()
    at = t0 - rollout_t0
    r.proc.terminate()
    while (now := await asyncio.to_thread(st.leader)) in (i, None):  # noqa: ASYNC110
        await asyncio.sleep(0.2)
    new_leader_s = time.monotonic() - t0
    exited = await asyncio.to_thread(r.proc.wait, 60)
    exit_s = time.monotonic() - t0
    st.start_replica(r)
    await st.wait_ready(r)
    print(f"rolled leader replica-{i}: replica-{now} led after {new_leader_s:.1f}s "
          f"(the old one exited {exited} after {exit_s:.1f}s)", flush=True)
    return {"replica": i, "at_s": round(at, 1), "new_leader_s": round(new_leader_s, 1),
            "old_leader_exit_s": round(exit_s, 1),
            "back_s": round(time.monotonic() - t0, 1), "new_leader": now}


def replay_main(args: Any) -> int:
    import logging
    import tempfile
    # A backend cut mid-stream (the rolled leader) is logged by aiohttp's server as an
    # error with its traceback, once per stream: the watchers count them instead.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        d = Path(args.state) if getattr(args, "state", None) else Path(tmp)
        d.mkdir(parents=True, exist_ok=True)
        r = asyncio.run(run(d, args))
    r["goal_met"] = report(r)
    if args.json:
        args.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0
