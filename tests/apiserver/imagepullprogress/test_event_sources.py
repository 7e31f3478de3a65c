"""A pod's pull state reads only kubelet's Events from the pod's node: an Event a tenant
writes (or another node's) never reaches the progress merge."""

from __future__ import annotations

import asyncio

from aggapi.apiserver.imagepullprogress.podwatch import PodWatchHub
from aggapi.apiserver.podsources import Sources
from tests.framework.fakekube import FakeKube


def _event(name: str, reason: str, component: str, host: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {"kind": "Pod", "name": "web", "namespace": "default",
                               "uid": "uid-web", "fieldPath": "spec.containers{app}"},
            "reason": reason, "message": f'Pulling image "busybox" ({name})',
            "source": {"component": component, "host": host},
            "lastTimestamp": "2026-01-01T00:00:00Z", "type": "Normal"}


async def test_only_kubelet_events_from_the_pods_node_count() -> None:
    kube = FakeKube()
    await kube.start()
    api = kube.kube_client()
    try:
        kube.put("api/v1", "pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "web", "namespace": "default", "uid": "uid-web"},
            "spec": {"nodeName": "n1", "containers": [{"name": "app", "image": "busybox"}]}})
        kube.put("api/v1", "events", _event("real", "Pulling", "kubelet", "n1"))
        kube.put("api/v1", "events", _event("forged", "Failed", "tenant", "n1"))
        kube.put("api/v1", "events", _event("other-node", "Failed", "kubelet", "n2"))
        sources = Sources(api, linger=0)
        async with PodWatchHub(sources).watch("default", "web") as w:
            await w.synced()
            await asyncio.sleep(0)
            assert [e["metadata"]["name"] for e in w.events] == ["real"]
        await sources.close()
    finally:
        await api.close()
        await kube.stop()
