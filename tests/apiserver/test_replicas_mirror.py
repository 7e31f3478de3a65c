"""Through graceful leader changes a watcher never relists (docs/kep-aggapi.md,
"What survives a leader change"): each follower mirrors the leader's podimagepulls and
its term starts from the mirror; a version the mirror never got is 410. N in-process
replicas with random routing (replicaharness.py).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections import store
from tests.framework.until import until

from .conftest import GV
from .replicaharness import (
    ALICE,
    RUNS,
    SYNCED,
    Cluster,
    PodScript,
    Reflector,
    name_of,
    pod_at,
    replicas,
    script_ops,
    until_settled,
)

__all__ = ["replicas"]  # the fixture

GRACEFUL = script_ops("elect", "warm")


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 3), ops=GRACEFUL, seed=st.integers(0, 2**16))
async def test_through_graceful_leader_changes_a_watcher_never_relists(
        replicas: Callable[[int], Any], n: int, ops: list[tuple[str, int]],
        seed: int) -> None:
    """Each leader change as a rolling update makes it (the old leader ends its term
    first; the next one's mirror had caught up), some after a hand-over (``warm``: the
    next leader's informers list and it builds while the pods change, and its term
    starts from that build diffed against its mirror, built yet or not): the reflector
    lists once and watches on through every term, nothing lost, nothing repeated,
    never a 410."""
    cluster: Cluster = await replicas(n)
    ns = f"g-{next(RUNS)}"  # a namespace of its own (hypothesis runs an example again)
    rng = random.Random(seed)
    await cluster.elect(rng.randrange(n))
    # The leader's cluster-wide feed serves every namespace (a namespace's own feed,
    # made while it builds, stamps the same changes with other versions) and each
    # follower mirrors it.
    await until(lambda: all(cluster.caught_up(j) for j in range(n)
                            if j != cluster.leading()))
    client = Reflector(cluster, ns, random.Random(seed + 1))
    task = asyncio.ensure_future(client.run())
    pods = PodScript(cluster.kube, ns)
    elected = 0
    try:
        await until(lambda: client.lists == 1)
        for op, i in ops:
            nxt = (cluster.leading() + 1 + i % (n - 1)) % n
            if op == "warm":
                cluster.warm(nxt)
            elif op == "elect" and await cluster.holds(nxt, client.rv):
                await cluster.elect(nxt)
                elected += 1
            else:
                pods.apply(op, i)
            await asyncio.sleep(rng.choice((0, 0.01, 0.06)))
        want = pods.want()

        await until_settled(cluster, rng, client, ns, want, f" elected={elected}")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (client.problems, client.gone, client.lists) == ([], 0, 1)


async def _mirrored_then_cut(cluster: Cluster, ns: str) -> int:
    """r0 leads; three pods of ``ns`` reach r1's mirror, which then hears nothing more
    of r0; the mirror's last version."""
    await cluster.elect(0)
    await until(lambda: cluster.caught_up(1))
    for i, done in ((0, False), (1, True), (2, False)):
        cluster.kube.put("api/v1", "pods", pod_at(ns, i, 0, done))
    await until(lambda: cluster.caught_up(1) and sum(
        o["metadata"]["namespace"] == ns
        for o in cluster.mirrors[1].collection.objects.values()) == 3)
    held = cluster.mirrors[1].collection.rv
    cluster.mirrors[1].follow(None)
    return held


async def test_a_version_the_mirror_never_got_is_410(replicas: Callable[[int], Any]) -> None:
    """The old leader stamps changes its follower's mirror never gets (its stream
    stopped): after the change of leader, a watch from such a version is 410, while
    one from the mirror's last version goes on."""
    cluster: Cluster = await replicas(2)
    ns = f"lacks-{next(RUNS)}"
    held = await _mirrored_then_cut(cluster, ns)
    assert 1 in SYNCED  # told once synced (the process freezes what it holds then)
    cluster.kube.put("api/v1", "pods", pod_at(ns, 0, 1, False))
    old = cluster.servers[0].parts.feeds.pods.get("")
    assert old is not None
    await until(lambda: old.collection.rv > held)
    lacked = old.collection.rv
    await cluster.elect(1)
    new = cluster.servers[1].parts.feeds.pods.get("")
    assert new is not None and new.seeded
    await until(new.synced.is_set)  # its first build, diffed against the mirror
    path = f"{GV}/namespaces/{ns}/podimagepulls?watch=true&timeoutSeconds=1&resourceVersion="
    srv = cluster.session(cluster.servers[1])
    async with srv.get(path + str(lacked), headers=ALICE) as resp:
        assert resp.status == 410, await resp.text()
    async with srv.get(path + str(held), headers=ALICE) as resp:
        assert resp.status == 200
        events = [json.loads(line) for line in (await resp.text()).splitlines() if line]
    # The new term's build finds step 1 (the change the mirror missed), in its epoch,
    # and nothing else: the other pods built again equal their mirrored objects.
    assert [(e["type"], name_of(e["object"]), e["object"]["metadata"]["labels"]["step"])
            for e in events] == [("MODIFIED", "p0", "1")]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) > lacked


async def test_a_warm_successors_term_changes_only_what_its_mirror_lacks(
        replicas: Callable[[int], Any]) -> None:
    """A hand-over's successor built while the leader led on: its term starts from
    that build, diffed against its mirror, so the one change the mirror missed comes
    in the new epoch and nothing else does; its feed is the warm one, not a new
    build."""
    cluster: Cluster = await replicas(2)
    ns = f"warm-{next(RUNS)}"
    held = await _mirrored_then_cut(cluster, ns)
    cluster.warm(1)
    feeds = cluster.servers[1].parts.feeds
    await until(lambda: feeds.warming is not None)
    warm = feeds.warming
    assert warm is not None
    cluster.kube.put("api/v1", "pods", pod_at(ns, 0, 1, False))
    await until(lambda: any(o["metadata"]["namespace"] == ns and name_of(o) == "p0"
                            and o["metadata"]["labels"]["step"] == "1"
                            for o in warm.collection.objects.values()))
    await cluster.elect(1)
    assert feeds.pods.get("") is warm and warm.seeded
    path = f"{GV}/namespaces/{ns}/podimagepulls?watch=true&timeoutSeconds=1&resourceVersion="
    async with cluster.session(cluster.servers[1]).get(path + str(held),
                                                       headers=ALICE) as resp:
        assert resp.status == 200
        events = [json.loads(line) for line in (await resp.text()).splitlines() if line]
    assert [(e["type"], name_of(e["object"]), e["object"]["metadata"]["labels"]["step"])
            for e in events] == [("MODIFIED", "p0", "1")]
    assert int(events[0]["object"]["metadata"]["resourceVersion"]) >> 32 == \
        cluster.elections[1].epoch


async def test_a_first_build_that_outgrows_the_history_still_goes_on_from_the_old_term(
        replicas: Callable[[int], Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The new term's first build changes more objects than its history holds (the
    old leader lagged kube; here its mirror missed them): a watch from the old term's
    last version gets each object's net change, not 410 and a relist of everything."""
    monkeypatch.setattr(store, "HISTORY_EVENTS", 4)
    cluster: Cluster = await replicas(2)
    await cluster.elect(0)
    ns = f"outgrow-{next(RUNS)}"
    for i in range(3):
        cluster.kube.put("api/v1", "pods", pod_at(ns, i, 0, False))
    await until(lambda: cluster.caught_up(1) and sum(
        o["metadata"]["namespace"] == ns
        for o in cluster.mirrors[1].collection.objects.values()) == 3)
    held = cluster.mirrors[1].collection.rv
    cluster.mirrors[1].follow(None)  # the mirror hears nothing more of r0
    for i in range(6):  # three changed, three new: six changes, the history holds four
        cluster.kube.put("api/v1", "pods", pod_at(ns, i, 1, False))
    await cluster.elect(1)
    new = cluster.servers[1].parts.feeds.pods.get("")
    assert new is not None
    await until(new.synced.is_set)
    await until(lambda: sum(o["metadata"]["namespace"] == ns
                            and o["metadata"]["labels"]["step"] == "1"
                            for o in new.collection.objects.values()) == 6)
    path = (f"{GV}/namespaces/{ns}/podimagepulls?watch=true&timeoutSeconds=1"
            f"&resourceVersion={held}")
    async with cluster.session(cluster.servers[1]).get(path, headers=ALICE) as resp:
        assert resp.status == 200, await resp.text()
        events = [json.loads(line) for line in (await resp.text()).splitlines() if line]
    assert sorted((e["type"], name_of(e["object"]), e["object"]["metadata"]["labels"]["step"])
                  for e in events) == [("ADDED", f"p{i}", "1") for i in (3, 4, 5)] + [
        ("MODIFIED", f"p{i}", "1") for i in (0, 1, 2)]
