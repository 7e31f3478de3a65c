"""Per-pod progress streams read their pods from the shared informers: the pods of
one namespace cost one pod watch and one event watch whatever their number, and a
change wakes only its own pod's streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from aggapi.apiserver.imagepullprogress.podwatch import PodWatchHub
from aggapi.apiserver.podsources import Sources
from tests.apiserver.collections.fakes import event, pod
from tests.framework.fakekube import FakeKube
from tests.framework.until import until


@pytest.fixture
async def sources(kube: FakeKube) -> AsyncIterator[Sources]:
    api = kube.kube_client()
    sources = Sources(api, linger=0)
    yield sources
    await sources.close()
    await api.close()


async def test_streams_of_a_namespace_share_two_watches_and_wake_only_their_pod(
        kube: FakeKube, sources: Sources) -> None:
    hub = PodWatchHub(sources)
    pods = [kube.put("api/v1", "pods", pod(f"p{i}")) for i in range(20)]
    kube.put("api/v1", "pods", pod("other", namespace="ns2"))
    async with hub.watch("ns1", "p0") as w0, hub.watch("ns1", "p1") as w1:
        await asyncio.gather(w0.synced(), w1.synced())
        assert w0.pod is not None and w0.pod["metadata"]["name"] == "p0"
        await until(lambda: kube.watching("pods") == 1 and kube.watching("events") == 1)
        v0, v1 = w0.version, w1.version
        kube.put("api/v1", "events", event(pods[1], "Pulling", 'Pulling image "x"'))
        assert await w1.wait_changed(v1, 5) != v1
        assert [e["reason"] for e in w1.events] == ["Pulling"]
        assert w0.version == v0 and w0.events == []
        # Another namespace's pod: its own source, while ns1's runs.
        async with hub.watch("ns2", "other") as w2:
            await w2.synced()
            assert w2.pod is not None
            await until(lambda: kube.watching("pods") == 2)
        assert len(hub) == 2
    await until(lambda: kube.watching("pods") == 0 and kube.watching("events") == 0)
    assert sources.watches() == 0 and len(hub) == 0


async def test_a_pod_missing_from_its_namespace_reads_none(sources: Sources) -> None:
    async with PodWatchHub(sources).watch("ns1", "ghost") as w:
        await w.synced()
        assert w.pod is None and w.events == []


async def test_a_pod_the_warm_informer_has_not_seen_yet_is_waited_for(
        kube: FakeKube, sources: Sources) -> None:
    hub = PodWatchHub(sources)
    kube.put("api/v1", "pods", pod("p0"))
    async with hub.watch("ns1", "p0") as w0:
        await w0.synced()
        await until(lambda: kube.watching("pods") == 1)
        # Made a moment ago: kube-apiserver has it, its ADDED is still on the way.
        watchers, kube._watchers = kube._watchers, set()
        kube.put("api/v1", "pods", pod("late"))
        kube._watchers = watchers
        async with hub.watch("ns1", "late") as w:
            synced = asyncio.create_task(w.synced(5))
            await asyncio.sleep(0.2)
            assert not synced.done()  # waiting for it: not reported missing
            kube.put("api/v1", "pods", pod("late"))  # reaches the informer
            await synced
            assert w.pod is not None and w.pod["metadata"]["name"] == "late"
