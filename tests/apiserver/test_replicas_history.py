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

from .replicaharness import (
    RUNS,
    Cluster,
    PodScript,
    Reflector,
    replicas,
    script_ops,
    until_settled,
)

__all__ = ["replicas"]  # the fixture

OPS = script_ops("elect", "forget")


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
    pods = PodScript(cluster.kube, ns)
    try:
        for op, i in ops:
            if op == "elect":
                await cluster.elect(i % n)
            elif op == "forget":
                await cluster.forget(i % n)
            else:
                pods.apply(op, i)
            await asyncio.sleep(rng.choice((0, 0.01, 0.06)))
        want = pods.want()

        await until_settled(cluster, rng, client, ns, want)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert client.problems == [], client.problems
