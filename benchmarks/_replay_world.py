"""The replay's world, one process: a fake kube-apiserver holding ``--pods`` pods on
``--nodes`` nodes (and their pull Events, the replicas' Lease, the agents'
EndpointSlices, the front-proxy authentication ConfigMap), hollow agents answering
the agent API the collections poll, and a rollout: each pod's pull starts at its
time, its bytes move, and it ends as kubelet ends one (a Pulled Event and the
container running with the image's digest, the agent's pull gone).

No etcd, kubelet or kwok: ``benchmarks._replay_kube`` (a fake kube-apiserver that
encodes each change once, as kube-apiserver's watch cache), and one HTTPS port for every
hollow agent (each node has its EndpointSlice naming it; the capability token's
audience says which node is asked; its signature is not checked here).

    python3 -m benchmarks._replay_world --dir D --nodes N --pods P ...

Writes ``D/world.json`` (ports) once serving, and ``D/done.log`` (CLOCK_MONOTONIC and
pod, one line per pull ended: when kubelet's Pulled Event was written).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import random
import signal
import ssl
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from benchmarks._replay_kube import ReplayKube
from tests.framework.fakekube import Obj

GROUP_HOST = "registry.replay.test"
NAMESPACE = "aggapi"
AGENT_SERVICE = "aggapi-agent"
TICK = 0.25  # seconds between simulation steps
MiB = 1 << 20


def namespace_of(i: int, namespaces: int) -> str:
    return f"replay-{i % namespaces}"


def node_of(i: int, nodes: int) -> str:
    return f"hollow-{i % nodes}"


def pod_object(i: int, nodes: int, namespaces: int) -> Obj:
    """Pod ``i`` as a Deployment's pod is stored (bound, its image not yet pulled)."""
    ns, name = namespace_of(i, namespaces), f"app-{i}"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{i:08d}",
                     "generateName": "app-",
                     "labels": {"app": "replay", "pod-template-hash": "5d4f8c7b9",
                                "tier": f"t{i % 7}"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                          "name": "app-5d4f8c7b9", "uid": "rs-uid",
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": {"nodeName": node_of(i, nodes), "restartPolicy": "Always",
                 "serviceAccountName": "default", "schedulerName": "default-scheduler",
                 "containers": [{"name": "app", "image": f"{GROUP_HOST}/app-{i}:v1",
                                 "imagePullPolicy": "IfNotPresent",
                                 "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                                 "env": [{"name": "POD", "value": name}],
                                 "resources": {"requests": {"cpu": "10m",
                                                            "memory": "16Mi"}}}]},
        "status": {"phase": "Pending", "hostIP": "10.0.0.1", "startTime": "2026-11-29T00:00:00Z",
                   "conditions": [{"type": "PodScheduled", "status": "True"},
                                  {"type": "Initialized", "status": "True"},
                                  {"type": "Ready", "status": "False",
                                   "reason": "ContainersNotReady"}],
                   "containerStatuses": [{"name": "app", "image": f"{GROUP_HOST}/app-{i}:v1",
                                          "imageID": "", "ready": False, "restartCount": 0,
                                          "state": {"waiting": {"reason": "ContainerCreating"}}}]}}


def event_object(pod: Obj, seq: int, reason: str, message: str) -> Obj:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{seq:016x}", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": meta["namespace"],
                               "name": meta["name"], "uid": meta["uid"],
                               "fieldPath": "spec.containers{app}"},
            "reason": reason, "message": message, "type": "Normal",
            "source": {"component": "kubelet", "host": pod["spec"]["nodeName"]},
            "reportingComponent": "kubelet", "reportingInstance": pod["spec"]["nodeName"],
            "firstTimestamp": "2026-11-29T00:00:00Z", "lastTimestamp": "2026-11-29T00:00:00Z",
            "count": 1}


class World:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kube = ReplayKube(history=args.history)
        self.kube.writable = {"leases"}
        self.kube.sar_policy = lambda _spec: True
        rng = random.Random(args.seed)
        # (start, duration, size) per pod: starts spread over the rollout's first part.
        self.plan = [(args.start_after + rng.random() * args.rollout, rng.uniform(*args.pull_s),
                      rng.randint(8 * MiB, 64 * MiB)) for _ in range(args.pods)]
        self.order = sorted(range(args.pods), key=lambda i: self.plan[i][0])
        self.next = 0
        self.active: dict[str, dict[int, float]] = {}  # node -> pod -> its pull's start
        # node -> (the tick it was encoded at, the agent's answer): a node pulling
        # is encoded again at most once a tick, when asked
        self.views: dict[str, tuple[int, bytes]] = {}
        self.tick = 0
        self.polls = 0  # agent API requests answered
        self.seq = 0
        self.t0 = 0.0

    # --- the kube side ---------------------------------------------------------
    def populate(self, auth_configmap: Obj) -> None:
        a = self.args
        self.kube.put("api/v1", "configmaps", auth_configmap)
        self.kube.tokens[a.replica_token] = {
            "username": f"system:serviceaccount:{NAMESPACE}:aggapi-apiserver",
            "groups": ["system:serviceaccounts"]}
        for n in range(a.nodes):
            node = node_of(n, a.nodes)
            self.kube.put("apis/discovery.k8s.io/v1", "endpointslices", {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": f"{AGENT_SERVICE}-{node}", "namespace": NAMESPACE,
                             "labels": {"kubernetes.io/service-name": AGENT_SERVICE}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": ["127.0.0.1"], "nodeName": node,
                               "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": a.agent_port, "protocol": "TCP"}]})
            self.views[node] = (0, self._view(node))
        for i in range(a.pods):
            self.kube.put("api/v1", "pods", pod_object(i, a.nodes, a.namespaces))
        self.kube.forget_history()  # the watches start from the lists

    def _event(self, pod: Obj, reason: str, message: str) -> None:
        self.seq += 1
        self.kube.put("api/v1", "events", event_object(pod, self.seq, reason, message))

    # --- the agents ------------------------------------------------------------
    def _view(self, node: str, now: float = 0.0) -> bytes:
        pulls = []
        for i, started in self.active.get(node, {}).items():
            _, took, size = self.plan[i]
            done = min(1.0, (now - started) / took)
            pulls.append({"lease": f"l-{i}", "startedAt": "2026-11-29T00:00:00Z",
                          "phase": "Downloading", "repositories": [f"{GROUP_HOST}/app-{i}"],
                          "images": [], "digest": "", "progress": int(size * done),
                          "total": size, "bytesPerSecond": size / took,
                          "downloadingLayers": 1})
        return json.dumps({
            "kind": "NodeImagePulls", "pulls": pulls, "inFlight": len(pulls),
            "slots": {"limit": None, "serialize": False, "source": "replay", "error": ""},
            "slotsFree": None, "linkBytesPerSecond": None, "error": "",
            "time": "2026-11-29T00:00:00Z"}).encode()

    async def imagepulls(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        try:
            part = token.split(".")[1]
            node = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))["aud"]
        except (IndexError, ValueError, KeyError):
            return web.Response(status=401)
        got = self.views.get(str(node))
        self.polls += 1
        if got is None:
            return web.Response(status=404)
        if got[0] != self.tick and node in self.active:
            got = self.views[node] = (self.tick, self._view(node, time.monotonic() - self.t0))
        return web.Response(body=got[1], content_type="application/json")

    # --- the rollout -------------------------------------------------------------
    async def simulate(self, done_log: Path) -> None:
        a = self.args
        with done_log.open("a", buffering=1) as out:
            while True:
                now = time.monotonic()
                elapsed = now - self.t0
                changed: set[str] = set()
                while (self.next < len(self.order)
                       and self.plan[self.order[self.next]][0] <= elapsed):
                    i = self.order[self.next]
                    self.next += 1
                    node = node_of(i, a.nodes)
                    self.active.setdefault(node, {})[i] = elapsed
                    pod = self.kube.get("api/v1", "pods", namespace_of(i, a.namespaces),
                                        f"app-{i}")
                    assert pod is not None
                    self._event(pod, "Pulling", f'Pulling image "{GROUP_HOST}/app-{i}:v1"')
                    changed.add(node)
                for node, pulls in self.active.items():
                    for i, started in list(pulls.items()):
                        if elapsed - started < self.plan[i][1]:
                            continue
                        del pulls[i]
                        changed.add(node)
                        self._finish(i, elapsed - started, out)
                for node in changed:
                    self.views[node] = (self.tick, self._view(node, elapsed))
                self.active = {n: p for n, p in self.active.items() if p}
                self.tick += 1
                if self.tick % 8 == 0:  # read by the bench: the agents' load
                    (done_log.parent / "world.stats").write_text(json.dumps({
                        "t": time.monotonic(), "agent_polls": self.polls,
                        "pulls_started": self.next, "writes": self.kube.rv,
                        "pulling": sum(map(len, self.active.values())),
                        "nodes_pulling": len(self.active)}))
                await asyncio.sleep(TICK)

    def _finish(self, i: int, took: float, out: Any) -> None:
        a = self.args
        ns, name = namespace_of(i, a.namespaces), f"app-{i}"
        pod = self.kube.get("api/v1", "pods", ns, name)
        assert pod is not None
        size = self.plan[i][2]
        image = f"{GROUP_HOST}/app-{i}:v1"
        self._event(pod, "Pulled", f'Successfully pulled image "{image}" in {took:.3f}s '
                                   f"({took:.3f}s including waiting). Image size: {size} bytes.")
        out.write(f"{time.monotonic():.3f} {ns}/{name}\n")  # the change, as kubelet made it
        pod["status"].update(phase="Running", conditions=[
            {"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}])
        pod["status"]["containerStatuses"] = [{
            "name": "app", "image": image, "imageID": f"{GROUP_HOST}/app-{i}@sha256:{i:064x}",
            "ready": True, "started": True, "restartCount": 0,
            "state": {"running": {"startedAt": "2026-11-29T00:00:01Z"}}}]
        self.kube.put("api/v1", "pods", pod)


async def amain(args: argparse.Namespace) -> None:
    out = Path(args.dir)
    world = World(args)
    world.populate(json.loads((out / "auth-configmap.json").read_text()))
    kube_url = await world.kube.start()
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(out / "pki/ca.crt"))
    ctx.load_cert_chain(out / "pki/agent.crt", out / "pki/agent.key")
    ctx.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_get("/v1/imagepulls", world.imagepulls)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", args.agent_port, ssl_context=ctx,
                      backlog=4096).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    go = asyncio.Event()
    loop.add_signal_handler(signal.SIGUSR1, go.set)  # the bench: replicas up, start
    (out / "world.json").write_text(json.dumps({"kube": kube_url}))
    sim: asyncio.Task[None] | None = None
    try:
        waiting = asyncio.create_task(go.wait())
        await asyncio.wait([waiting, asyncio.create_task(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if go.is_set():
            world.t0 = time.monotonic()
            (out / "world.t0").write_text(f"{world.t0:.3f}\n")
            sim = asyncio.create_task(world.simulate(out / "done.log"))
            await stop.wait()
    finally:
        if sim is not None:
            sim.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sim
        await runner.cleanup()
        await world.kube.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m benchmarks._replay_world")
    p.add_argument("--dir", required=True)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--pods", type=int, required=True)
    p.add_argument("--namespaces", type=int, default=10)
    p.add_argument("--agent-port", type=int, required=True)
    p.add_argument("--replica-token", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start-after", type=float, default=5.0,
                   help="seconds after the go signal before the first pull")
    p.add_argument("--rollout", type=float, default=60.0,
                   help="pulls start spread over this many seconds")
    p.add_argument("--pull-s", type=float, nargs=2, default=(3.0, 10.0))
    p.add_argument("--history", type=int, default=200_000,
                   help="watch history the fake kube-apiserver keeps (events)")
    asyncio.run(amain(p.parse_args(argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
