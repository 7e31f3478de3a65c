"""Memory per pod followed through podimagepulls, and the watches that costs.

Fills a fake kube-apiserver (in this process) with N pods of one namespace on
``--nodes`` nodes, each with kubelet's Pulling event and a pull in flight on its
node's (scripted) agent view, then lists them through the real feeds (informers,
node polls, merge, store) twice, N and 2N pods, with tracemalloc on: the slope is
what one more followed pod costs this server. The fake's own store is built before
tracing starts. Pods carry managedFields and a status as real ones do.

Goal: bounded per pod (printed: KiB per pod) and 2 watches on kube-apiserver whatever
N (one pod watch, one event watch).

    python3 -m benchmarks.bench_collections_memory [--pods 2000] [--nodes 50]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
import tracemalloc
from typing import Any, cast

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.podsources import Sources
from tests.apiserver.collections.fakes import FakeAgent, event, node_view, pod, pull
from tests.framework.fakekube import FakeKube

GOAL_KIB_PER_POD = 64.0
GOAL_WATCHES = 2


def _realistic(name: str, node: str) -> dict[str, Any]:
    obj = pod(name, f"registry.test/app-{name}:1", node=node, labels={"app": "web"})
    obj["metadata"]["managedFields"] = [{"manager": "kube-controller-manager",
                                         "operation": "Update", "fieldsType": "FieldsV1",
                                         "fieldsV1": {"f:spec": {f"f:x{i}": {}
                                                                 for i in range(20)}}}]
    obj["status"] = {"phase": "Pending", "conditions": [
        {"type": t, "status": "False"} for t in ("Initialized", "Ready", "PodScheduled")],
        "containerStatuses": [{"name": "app", "ready": False, "restartCount": 0,
                               "image": f"registry.test/app-{name}:1", "imageID": "",
                               "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    return obj


async def measure(pods: int, nodes: int) -> dict[str, float]:
    kube = FakeKube(history=10)
    await kube.start()
    agent = FakeAgent()
    for n in range(nodes):
        agent.views[f"node-{n}"] = node_view(*(
            pull(f"registry.test/app-p{i}", progress=10, total=100, rate=5.0)
            for i in range(n, pods, nodes)), limit=None)
    for i in range(pods):
        p = kube.put("api/v1", "pods", _realistic(f"p{i}", f"node-{i % nodes}"))
        kube.put("api/v1", "events", event(p, "Pulling", f'Pulling image "p{i}"'))
    api = kube.kube_client()
    feeds = Feeds(Sources(api, linger=60), cast(AgentClient, agent), linger=60,
                  poll_interval=1.0)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    t0 = time.monotonic()
    async with feeds.pods.use("ns1") as feed:
        await feed.ready()
        first_list = time.monotonic() - t0
        assert len(feed.collection.objects) == pods
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        watches = kube.watching("pods") + kube.watching("events")
    tracemalloc.stop()
    await feeds.close()
    await api.close()
    await kube.stop()
    return {"pods": pods, "held_mib": held / 2**20, "first_list_s": first_list,
            "watches": watches, "agent_polls": sum(1 for _ in agent.reads)}


async def run(pods: int, nodes: int) -> None:
    small = await measure(pods, nodes)
    big = await measure(2 * pods, nodes)
    per_pod = (big["held_mib"] - small["held_mib"]) * 1024 / pods
    for r in (small, big):
        print(f"pods: {r['pods']:.0f}  held: {r['held_mib']:.1f} MiB  first list: "
              f"{r['first_list_s']:.2f} s  watches on kube-apiserver: {r['watches']:.0f}  "
              f"nodes polled: {r['agent_polls']:.0f}")
    print(f"memory per followed pod: {per_pod:.1f} KiB "
          f"({'met' if per_pod <= GOAL_KIB_PER_POD else 'NOT met'}: <= {GOAL_KIB_PER_POD})")
    worst = max(small["watches"], big["watches"])
    print(f"watches: {worst:.0f} ({'met' if worst <= GOAL_WATCHES else 'NOT met'}: "
          f"<= {GOAL_WATCHES} whatever the pod count)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=50)
    args = ap.parse_args()
    asyncio.run(run(args.pods, args.nodes))


if __name__ == "__main__":
    main()
