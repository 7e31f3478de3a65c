"""What the shared pod and event informers keep: a cluster's worth of pods is held.
(``kube``: tests/apiserver/conftest.py's fake kube-apiserver.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aggapi.apiserver.podsources import Source
from tests.framework.fakekube import FakeKube

from .collections.fakes import event, pod


@contextlib.asynccontextmanager
async def synced_source(kube: FakeKube, namespace: str) -> AsyncIterator[Source]:
    """A pod and event Source of ``namespace`` on ``kube``, listed; stopped after."""
    async with kube.kube_client() as api:
        src = Source(api, namespace)
        src.start()
        try:
            await src.wait_synced(5)
            yield src
        finally:
            await src.stop()


async def test_keeps_pull_events_only_and_no_managed_fields(kube: FakeKube) -> None:
    p = pod("web-0")
    p["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    kube.put("api/v1", "pods", p)
    for reason in ("Scheduled", "Pulling", "Created", "Started", "Pulled"):
        ev = event(p, reason, f"{reason} something")
        ev["metadata"]["managedFields"] = [{"manager": "kubelet"}]
        kube.put("api/v1", "events", ev)
    async with synced_source(kube, "ns1") as src:
        (kept,) = src.pods.items.values()
        assert "managedFields" not in kept["metadata"]
        assert kept["spec"] == p["spec"] and kept["metadata"]["uid"] == p["metadata"]["uid"]
        evs = src.events_of(("ns1", "web-0"))
        assert sorted(e["reason"] for e in evs) == ["Pulled", "Pulling"]
        assert all("managedFields" not in e["metadata"] for e in evs)
        # the informer's own cache holds no more than the index reads
        assert sorted(e["reason"] for e in src._events.items.values()) == [
            "Pulled", "Pulling"]
        kube.put("api/v1", "events", event(p, "BackOff", "Back-off pulling", n=9))
        kube.put("api/v1", "events", event(p, "Killing", "Stopping", n=10))
        for _ in range(100):
            if len(src.events_of(("ns1", "web-0"))) == 3:
                break
            await asyncio.sleep(0.02)
        assert sorted(e["reason"] for e in src.events_of(("ns1", "web-0"))) == [
            "BackOff", "Pulled", "Pulling"]
        await asyncio.sleep(0.2)
        assert len(src._events.items) == 3

