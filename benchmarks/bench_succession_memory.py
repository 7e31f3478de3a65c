"""A successor's memory at its peak: what a follower holds when it succeeds a leader
that hands over (election.py, feedset.py ``prepare``/``new_term``), at the replay's
scale (50,000 pods on 5,000 nodes), in one process.

A fake kube-apiserver (``benchmarks._replay_kube``, the replay world's, in a child
process so its store is not counted) holds the replay's pods and their pull Events;
a scripted agent shows each node's pulls. The follower, in this process:

1. mirrors the leader's podimagepulls (``mirror.Mirror``'s own parse and apply: the
   initial events, then ``--changes`` changes, its history full);
2. warms its next term's feed (``Feeds.prepare``: pod and event informers, every
   object built, the nodes' first views);
3. takes the mirror and starts its term (``Feeds.new_term``: the warm feed promoted,
   diffed against the mirror), then its first changes;
4. the GC freeze the server runs after a build (``gctune.freeze``).

After each step: RSS (VmRSS, and VmHWM: the peak since the last step), with
``--trace`` Python's traced bytes, and each part's own bytes (a walk of its objects,
what two parts share counted once, in the first; the walk's own memory is left out of
the peaks). Goal: the peak RSS under 1 GiB (the replay's ``replica_rss_peak_mib_max``;
the interpreter and libraries this process loads count in it, as in a replica). A
replica holds more than this (its HTTPS clients, watchers, kube's watch streams in a
rollout): the figures rank the parts, the replay proves the peak.

    python3 -m benchmarks.bench_succession_memory [--pods 50000] [--nodes 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any, cast

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.collections.podimagepulls import pod_image_pull
from aggapi.apiserver.election import Election
from aggapi.apiserver.mirror import INITIAL_EVENTS_END, Mirror
from aggapi.apiserver.podslim import slim_pod
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.replicas import Forwarder
from aggapi.kube.client import client_for_url
from aggapi.serve import gctune
from benchmarks._replay_world import (
    GROUP_HOST,
    event_object,
    namespace_of,
    node_of,
    pod_object,
)
from tests.apiserver.collections.fakes import FakeAgent, node_view, pull

GOAL_MIB = 1024.0
MiB = 1 << 20
EPOCH = 7


def _last_ended(args: argparse.Namespace) -> tuple[str, str]:
    """The last pod ``_rollout`` ends (its Events seen: the rollout reached here)."""
    ended = [i for i in range(args.pods) if _pulling(i, args.pulled)][:args.rollout]
    return namespace_of(ended[-1], args.namespaces), f"app-{ended[-1]}"


def _pulling(i: int, pulled: float) -> bool:
    """Pod ``i``'s pull still in flight (the others ended: Pulled, running)."""
    return (i * 7919) % 1000 >= pulled * 1000


def _world(pods: int, nodes: int, namespaces: int, pulled: float, changes: int,
           out: Path, conn: Any) -> None:
    """The child: the fake kube-apiserver, and the leader's watch stream (what the
    mirror reads) written to ``out``."""
    from benchmarks._replay_kube import ReplayKube

    kube = ReplayKube(history=1000)
    seq = 0
    lines = []
    for i in range(pods):
        p = pod_object(i, nodes, namespaces)
        evs = [event_object(p, seq := seq + 1, "Pulling",
                            f'Pulling image "{GROUP_HOST}/app-{i}:v1"')]
        if not _pulling(i, pulled):
            evs.append(event_object(p, seq := seq + 1, "Pulled",
                                    f'Successfully pulled image "{GROUP_HOST}/app-{i}:v1" '
                                    "in 3.000s (3.000s including waiting). Image size: "
                                    "33554432 bytes."))
            p["status"].update(phase="Running", conditions=[
                {"type": "Ready", "status": "True"}])
            p["status"]["containerStatuses"] = [{
                "name": "app", "image": f"{GROUP_HOST}/app-{i}:v1",
                "imageID": f"{GROUP_HOST}/app-{i}@sha256:{i:064x}", "ready": True,
                "started": True, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-11-29T00:00:01Z"}}}]
        stored = kube.put("api/v1", "pods", p)
        for ev in evs:
            kube.put("api/v1", "events", ev)
        # The leader's object of this pod (a view: its pull half done)
        view = node_view(pull(f"{GROUP_HOST}/app-{i}", progress=1 << 24,
                              total=1 << 25, rate=1e6)) if _pulling(i, pulled) else None
        obj = pod_image_pull(slim_pod(stored), evs, view)
        obj["metadata"]["resourceVersion"] = str((EPOCH - 1 << 32) + i + 1)
        lines.append(json.dumps({"type": "ADDED", "object": obj}))
        if i >= pods - changes:  # the leader's later changes of some of them
            obj = json.loads(lines[-1])["object"]
            obj["status"]["progress"] = (obj["status"]["progress"] or 0) + 1
            lines.append(json.dumps({"type": "MODIFIED", "object": obj}))
    kube.forget_history()
    # The bookmark ends the initial events; the changes follow it, in order.
    head = [ln for ln in lines if ln.startswith('{"type": "ADDED"')]
    tail = [ln for ln in lines if ln.startswith('{"type": "MODIFIED"')]
    rv = (EPOCH - 1 << 32) + pods
    for n, ln in enumerate(tail):
        ev = json.loads(ln)
        ev["object"]["metadata"]["resourceVersion"] = str(rv + n + 1)
        tail[n] = json.dumps(ev)
    mark = json.dumps({"type": "BOOKMARK", "object": {"kind": "PodImagePull",
                       "metadata": {"resourceVersion": str(rv), "annotations": {
                           INITIAL_EVENTS_END: "true"}}}})
    out.write_text("\n".join([*head, mark, *tail]) + "\n")

    async def serve() -> None:
        conn.send(await kube.start())
        loop = asyncio.get_running_loop()
        while (n := await loop.run_in_executor(None, conn.recv)) != "stop":
            _rollout(kube, pods, nodes, namespaces, pulled, int(n))
            conn.send("done")
        await kube.stop()

    asyncio.run(serve())


def _rollout(kube: Any, pods: int, nodes: int, namespaces: int, pulled: float,
             n: int) -> None:
    """The rollout goes on: ``n`` pods whose pull was in flight end it (a Pulled Event,
    the container running), as kubelet ends one."""
    ended = 0
    for i in range(pods):
        if ended >= n:
            break
        if not _pulling(i, pulled):
            continue
        p = kube.get("api/v1", "pods", namespace_of(i, namespaces), f"app-{i}")
        if p is None or p["status"]["phase"] == "Running":
            continue
        ended += 1
        kube.put("api/v1", "events", event_object(
            p, pods * 2 + i, "Pulled", f'Successfully pulled image "{GROUP_HOST}/app-{i}:v1" '
            "in 3.000s (3.000s including waiting). Image size: 33554432 bytes."))
        p = json.loads(json.dumps(p))
        p["status"].update(phase="Running", conditions=[{"type": "Ready", "status": "True"}])
        p["status"]["containerStatuses"] = [{
            "name": "app", "image": f"{GROUP_HOST}/app-{i}:v1",
            "imageID": f"{GROUP_HOST}/app-{i}@sha256:{i:064x}", "ready": True,
            "started": True, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-11-29T00:00:01Z"}}}]
        kube.put("api/v1", "pods", p)


class _Content:
    def __init__(self, data: bytes) -> None:
        self._data = data

    async def iter_any(self) -> AsyncIterator[bytes]:
        for i in range(0, len(self._data), 1 << 16):  # as a socket brings it
            yield self._data[i:i + (1 << 16)]


class _Stream:
    def __init__(self, data: bytes) -> None:
        self.content = _Content(data)


def _rss() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return (int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024)


def _reset_peak() -> None:
    """VmHWM back to the current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _walk(roots: Iterable[Any], seen: set[int]) -> int:
    """Bytes of the objects reachable from ``roots`` (containers, strings, numbers,
    dataclass instances) not already in ``seen``."""
    total, stack = 0, list(roots)
    while stack:
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, bool):
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list | tuple | set | frozenset):
            stack.extend(o)
        elif hasattr(o, "__dataclass_fields__"):
            stack.extend(getattr(o, f) for f in o.__dataclass_fields__)
    return total


async def _sample(over: float, feeds: Feeds) -> None:
    """With tracemalloc on: where the Python objects are the first time RSS passes
    ``over`` MiB (the build's transient peak). ``--verbose``: RSS each time it grew."""
    last = 0.0
    while over:
        await asyncio.sleep(0.05)
        rss = _rss()[0]
        if rss > last + 50 or rss < last - 50:
            warm = feeds.warming
            print(f"    rss {rss:.0f} warm objects "
                  f"{len(warm.collection.objects) if warm else -1}", flush=True)
            last = rss
        if _rss()[0] > over and tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot()
            print(f"RSS over {over:.0f} MiB: traced "
                  f"{tracemalloc.get_traced_memory()[0] / MiB:.1f} MiB, top lines:")
            for st in snap.statistics("lineno")[:15]:
                print(f"  {st.size / MiB:7.1f} MiB {st.count:8d} {st.traceback[0]}")
            return


def _history(col: Any) -> list[Any]:
    return list(col._history)


async def run(args: argparse.Namespace, lines_file: Path) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    here, there = ctx.Pipe()
    child = ctx.Process(target=_world, args=(args.pods, args.nodes, args.namespaces,
                                             args.pulled, args.changes, lines_file, there))
    child.start()
    url = here.recv()
    agent = FakeAgent()
    for n in range(args.nodes):
        node = node_of(n, args.nodes)
        agent.views[node] = node_view(*(
            pull(f"{GROUP_HOST}/app-{i}", progress=1 << 24, total=1 << 25, rate=1e6)
            for i in range(n, args.pods, args.nodes) if _pulling(i, args.pulled)))
    api = client_for_url(url)
    feeds = Feeds(Sources(api, linger=60), cast(AgentClient, agent), linger=60,
                  poll_interval=1.0, warm=True)
    mirror = Mirror(cast(Forwarder, None), cast(Election, None))
    gc.collect()
    tracemalloc.start() if args.trace else None
    rows: list[dict[str, Any]] = []
    seen_parts: dict[str, Callable[[], Iterable[Any]]] = {}

    def stage(name: str) -> None:
        gc.collect()
        rss, hwm = _rss()
        traced = tracemalloc.get_traced_memory()[0] / MiB if args.trace else 0.0
        seen: set[int] = set()
        parts = {k: _walk(fn(), seen) / MiB for k, fn in seen_parts.items()}
        del seen
        gc.collect()
        _reset_peak()  # the walk's own ids set is not the successor's
        rows.append({"stage": name, "rss": rss, "hwm": hwm, "traced": traced, **parts})
        print(f"{name:<34} RSS {rss:7.1f}  peak {hwm:7.1f} MiB  "
              + (f"traced {traced:7.1f}  " if args.trace else "")
              + "  ".join(f"{k} {v:.1f}" for k, v in parts.items() if v >= 0.05), flush=True)

    _reset_peak()
    stage("start")
    sampler = asyncio.create_task(_sample(args.snap_over, feeds))
    src = feeds.sources
    data = await asyncio.to_thread(lines_file.read_bytes)
    t0 = time.monotonic()
    await mirror._follow(cast(Any, _Stream(data)), mirror.collection)
    del data
    mcol = mirror.collection
    seen_parts["mirror.objects"] = lambda: [mcol.objects]
    seen_parts["mirror.history"] = lambda: _history(mcol)
    stage(f"1 mirror synced ({time.monotonic() - t0:.1f} s)")
    gctune.freeze() if args.freeze_mirror else None  # as the follower does (on_synced)

    t0 = time.monotonic()
    prep = asyncio.create_task(feeds.prepare(lambda: mcol.objects))
    warm = None
    while warm is None:
        await asyncio.sleep(0.01)
        warm = feeds.warming
    await warm.source.wait_synced(timeout=None)
    source = src.acquire("")
    src.release("")
    seen_parts["warm.objects"] = lambda: [warm.collection.objects] if warm else []
    seen_parts["pods informer"] = lambda: [source.pods.items]
    seen_parts["events informer"] = lambda: [source._events.items, source._by_pod]
    seen_parts["node views"] = lambda: [p.view for p in (feeds.polls.parts().values()
                                                         if feeds.polls else ())]
    seen_parts["feed index"] = lambda: [warm._slices, warm.on_node, warm._needs,
                                        warm._node_of] if warm else []
    stage(f"2a informers listed ({time.monotonic() - t0:.1f} s)")
    await prep
    stage(f"2b warm feed built ({time.monotonic() - t0:.1f} s)")

    t0 = time.monotonic()
    seed = await mirror.take(settle=0)
    await feeds.new_term(EPOCH, seed=seed)
    term = feeds.pods.get("")
    assert term is not None
    tcol = term.collection
    del seed
    seen_parts.pop("warm.objects")
    seen_parts["term.objects"] = lambda: [tcol.objects]
    seen_parts["term.history"] = lambda: _history(tcol)
    seen_parts["term.snapshots"] = lambda: [k.state for k in tcol._snapshots.values()]
    seen_parts["mirror.objects"] = lambda: []
    seen_parts["mirror.history"] = lambda: []
    stage(f"3 term promoted ({time.monotonic() - t0:.2f} s)")
    await feeds.built.wait()
    stage("3b term built")
    gctune.freeze()
    stage("4 GC frozen")
    gc.unfreeze()
    if args.rollout:
        # A paged list at the term's start (its state kept for its later pages), then
        # the rollout goes on: the objects it replaces stay held by what keeps them.
        tcol.keep_state(tcol.rv, tcol.objects)
        t0 = time.monotonic()
        here.send(str(args.rollout))
        await asyncio.get_running_loop().run_in_executor(None, here.recv)
        last = _last_ended(args)
        while term.pending or len(term.source.events_of(last)) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # (no event says the informers got there)
        await asyncio.sleep(0.5)
        stage(f"5 {args.rollout} pulls ended ({time.monotonic() - t0:.1f} s)")

    sampler.cancel()
    peak = max(r["hwm"] for r in rows)
    print(f"successor RSS peak: {peak:.1f} MiB "
          f"({'met' if peak < GOAL_MIB else 'NOT met'}: < {GOAL_MIB:.0f}); "
          f"pods {args.pods}, nodes {args.nodes}, load {os.getloadavg()[0]:.2f}")
    await feeds.close()
    await api.close()
    here.send("stop")
    child.join(30)
    return {"rows": rows, "peak_mib": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=50_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--namespaces", type=int, default=10)
    ap.add_argument("--pulled", type=float, default=0.5,
                    help="share of the pods whose pull ended before the succession")
    ap.add_argument("--changes", type=int, default=8192,
                    help="the leader's changes the mirror applies after its sync")
    ap.add_argument("--rollout", type=int, default=20_000,
                    help="pulls that end after the term started (0: none)")
    ap.add_argument("--trace", action="store_true", help="tracemalloc too (slower)")
    ap.add_argument("--freeze-mirror", action="store_true",
                    help="the GC freeze after the mirror's sync, as a replica")
    ap.add_argument("--snap-over", type=float, default=0.0,
                    help="with --trace: the top allocations once RSS passes this (MiB)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="succmem-") as tmp:
        out = asyncio.run(run(args, Path(tmp) / "leader.jsonl"))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    raise SystemExit(0 if out["peak_mib"] < GOAL_MIB else 1)


if __name__ == "__main__":
    main()
