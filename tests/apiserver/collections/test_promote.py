"""A successor's warm feed (``Feeds.prepare``) promoted to its term's at any point of
its warm-up (not listed yet, half built, built): the term ends with the objects a
cold build finds, and the changes it stamps over the mirror (the old term's state)
are only real differences, each after every mirrored version."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections import feeds as feeds_module
from aggapi.apiserver.collections.feeds import PodFeed
from aggapi.apiserver.collections.store import EPOCH_SHIFT, Clock, Collection
from aggapi.apiserver.podsources import Sources
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .fakes import event, pod

RUNS = itertools.count()


def bare(objects: dict[Hashable, dict[str, Any]]) -> dict[Hashable, Any]:
    return {k: {**o, "metadata": {m: v for m, v in o["metadata"].items()
                                  if m != "resourceVersion"}} for k, o in objects.items()}


async def built(sources: Sources, ns: str, clock: Clock,
                basis: Any = None) -> PodFeed:
    feed = PodFeed(sources, ns, None, clock, basis=basis)  # no agent: kube's view only
    feed.start()
    return feed


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(listed=st.booleans(), turns=st.integers(0, 8),
       changes=st.lists(st.tuples(st.sampled_from(["add", "step", "delete"]),
                                  st.integers(0, 7)), max_size=8))
async def test_a_warm_feed_promoted_at_any_point_ends_as_a_cold_build(
        kube: FakeKube, monkeypatch: pytest.MonkeyPatch, listed: bool, turns: int,
        changes: list[tuple[str, int]]) -> None:
    monkeypatch.setattr(feeds_module, "FLUSH_BATCH", 1)  # one pod a turn of the loop
    ns = f"promote-{next(RUNS)}"
    pods = {i: 0 for i in range(5)}
    for i in pods:
        kube.put("api/v1", "pods", pod(f"p{i}", namespace=ns, labels={"step": "0"}))
    client = kube.kube_client()
    sources = Sources(client, linger=0)
    old = await built(sources, ns, Clock(10))  # the old leader's, mirrored
    await until(old.synced.is_set)
    mirror = Collection(Clock(0))
    mirror.reset(dict(old.collection.objects), old.collection.rv)
    await old.stop()
    held = mirror.rv
    for op, i in changes:  # what the mirror never got
        if op == "add" and i not in pods:
            pods[i] = 0
        elif op == "step" and i in pods:
            pods[i] += 1
        elif op == "delete" and i in pods:
            del pods[i]
            kube.delete("api/v1", "pods", ns, f"p{i}")
            continue
        if i in pods:
            kube.put("api/v1", "pods", pod(f"p{i}", namespace=ns,
                                           labels={"step": str(pods[i])}))
    warm = await built(sources, ns, Clock(0), basis=lambda: mirror.objects)
    if listed:  # then a pod a turn of the loop: promoted half built, or built
        while not warm.source.synced:  # noqa: ASYNC110 (the turn it comes matters)
            await asyncio.sleep(0)
        for _ in range(turns):
            await asyncio.sleep(0)
    warm.promote(mirror, Clock(11))
    try:
        assert warm.collection is mirror
        await until(lambda: warm.synced.is_set() and not warm.pending)
        cold = await built(sources, ns, Clock(12))
        await until(cold.synced.is_set)
        assert bare(mirror.objects) == bare(cold.collection.objects)
        await cold.stop()
        for ev in mirror.since(held) if mirror.owns(held) else ():
            assert ev.rv >> EPOCH_SHIFT == 11
            assert ev.prev is None or ev.type == "DELETED" or \
                bare({0: ev.prev}) != bare({0: ev.obj}), "a change that changed nothing"
    finally:
        await warm.stop()
        await sources.close()
        await client.close()


async def test_a_build_starts_with_the_pods_kube_changed_last(
        kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    """A successor's term starts before its build ends: the changes its old leader had
    not stamped are kube's newest, and are built first (by the pod's version or its
    newest event's), not anywhere among every pod."""
    monkeypatch.setattr(feeds_module, "FLUSH_BATCH", 2)
    ns = f"newest-{next(RUNS)}"
    pods = {i: pod(f"p{i}", namespace=ns) for i in range(8)}
    for obj in pods.values():
        kube.put("api/v1", "pods", obj)
    kube.put("api/v1", "pods", pod("p2", namespace=ns, labels={"step": "1"}))
    for i in (0, 1, 3, 4, 6, 7):  # older events than both changes below
        kube.put("api/v1", "events", event(pods[i], "Pulling", "Pulling image"))
    kube.put("api/v1", "pods", pod("p5", namespace=ns, labels={"step": "1"}))
    kube.put("api/v1", "events", event(pods[6], "Pulled", "Successfully pulled image"))
    client = kube.kube_client()
    sources = Sources(client, linger=0)
    feed = await built(sources, ns, Clock(0))
    try:
        await until(lambda: len(feed.collection.objects) >= 2)
        first = {key[1] for key in list(feed.collection.objects)[:2]}  # type: ignore[index]
        await until(feed.synced.is_set)
        assert first == {"p6", "p5"} and len(feed.collection.objects) == 8
    finally:
        await feed.stop()
        await sources.close()
        await client.close()
