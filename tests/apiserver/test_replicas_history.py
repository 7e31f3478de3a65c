"""One history across replicas (docs/kep-aggapi.md, "Consistency model"): N
in-process apiserver replicas over the same pods and agent (replicaharness.py), each
request routed to a random replica as the aggregator does, leaders changing and
replicas losing their state at random. A client that lists (in pages, each page on any
replica) and then watches, relisting on 410 as client-go's reflector does, ends with a
cache equal to a fresh list: every final phase seen, no event lost, none repeated, all
in order.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.framework.until import until

from .replicaharness import RUNS, Cluster, Reflector, name_of, pod_at, replicas, view_of

__all__ = ["replicas"]  # the fixture

OPS = st.lists(st.tuples(st.sampled_from(["add", "add", "step", "step", "done", "delete",
                                          "elect", "forget"]),
                         st.integers(0, 5)), min_size=12, max_size=30)


@settings(max_examples=10, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(2, 3), ops=OPS, seed=st.integers(0, 2**16))
async def test_a_reflector_through_random_replicas_ends_equal_to_a_fresh_list(
        replicas: Callable[[int], Any], n: int, ops: list[tuple[str, int]],
        seed: int) -> None:
    cluster: Cluster = await replicas(n)
    ns = f"ns-{next(RUNS)}"  # a namespace of its own (hypothesis runs an example again)
    rng = random.Random(seed)
    await cluster.elect(rng.randrange(n))
    client = Reflector(cluster, ns, random.Random(seed + 1))
    task = asyncio.ensure_future(client.run())
    steps: dict[int, int] = {}
    done: set[int] = set()
    try:
        for op, i in ops:
            if op == "add" and i not in steps:
                steps[i] = 0
                cluster.kube.put("api/v1", "pods", pod_at(ns, i, 0, False))
            elif op in ("step", "done") and i in steps:
                steps[i] += 1
                done |= {i} if op == "done" else set()
                cluster.kube.put("api/v1", "pods", pod_at(ns, i, steps[i], i in done))
            elif op == "delete" and i in steps:
                del steps[i]
                done.discard(i)
                cluster.kube.delete("api/v1", "pods", ns, f"p{i}")
            elif op == "elect":
                await cluster.elect(i % n)
            elif op == "forget":
                await cluster.forget(i % n)
            await asyncio.sleep(rng.choice((0, 0.01, 0.06)))
        want = {f"p{i}": (str(s), "Done" if i in done else "Pending")
                for i, s in steps.items()}

        async def settled() -> bool:
            # From the client's own history (a namespace's feed, made while the
            # cluster-wide one built, stamps the same changes with other versions).
            since = f"?resourceVersion={client.rv}" if client.rv else ""
            code, fresh = await cluster.get(rng, f"/namespaces/{ns}/podimagepulls{since}")
            if code != 200:
                return False
            truth = {name_of(o): view_of(o) for o in fresh["items"]}
            last[:] = [truth, {k: view_of(o) for k, o in client.cache.items()}, want]
            return {k: v[:2] for k, v in truth.items()} == want and \
                {k: view_of(o) for k, o in client.cache.items()} == truth
        last: list[Any] = []
        try:
            await until(settled, within=15)
        except AssertionError:
            raise AssertionError(f"{last} {client.problems} lists={client.lists} "
                                 f"gone={client.gone}") from None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert client.problems == [], client.problems
