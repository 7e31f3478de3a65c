"""bench_progress_accuracy's scenarios: each pod's layers, the link's rate, how many
pods and nodes, and which scenarios a run picks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks._accuracy_score import MiB


@dataclass(frozen=True)
class Scenario:
    name: str
    layers_mib: tuple[float, ...]
    rate: int  # the link, bytes/s
    containerd: str = "2.x"
    pods: int = 1  # each with its own image of ``layers_mib``, pulled at once
    nodes: int = 1  # pod k on node (k-1) % nodes; more than one: the cluster path only
    # Pod k's own layers (k >= 2: other_pods_mib[k-2]) where they differ from layers_mib.
    other_pods_mib: tuple[tuple[float, ...], ...] = ()

    def layers(self, k: int) -> tuple[float, ...]:
        """Pod ``k``'s layers (MiB), k from 1."""
        return self.other_pods_mib[k - 2] if 2 <= k <= len(self.other_pods_mib) + 1 \
            else self.layers_mib

    @property
    def seconds(self) -> float:
        return sum(sum(self.layers(k)) for k in range(1, self.pods + 1)) * MiB / self.rate


SCENARIOS = [
    Scenario("l1-50k", (3,), 50_000),
    Scenario("l1-400k", (16,), 400_000),
    Scenario("l3-400k", (10, 6, 2), 400_000),
    Scenario("l6-400k", (8, 6, 4, 3, 2, 1), 400_000),
    Scenario("l1-5m", (100,), 5_000_000),
    Scenario("l3-5m", (60, 30, 15), 5_000_000),
    Scenario("l6-5m", (40, 25, 15, 12, 8, 5), 5_000_000),
    Scenario("2pods-400k", (8, 4), 400_000, pods=2),
    Scenario("l3-400k-ctd16", (10, 6, 2), 400_000, containerd="1.6"),
    Scenario("2nodes-400k", (8, 4), 400_000, pods=2, nodes=2),
    # Node 2's pull ends first: node 1's share of the link then grows, which nothing on
    # node 1 can see coming.
    Scenario("2nodes-400k-uneven", (8, 4), 400_000, pods=2, nodes=2, other_pods_mib=((3,),)),
]
QUICK = ("l3-5m",)
CLUSTER_DEFAULT = ("2nodes-400k", "2nodes-400k-uneven")
HOST_PATH = "host-process harness, 1 node"


def pick(names: Sequence[str] | None, *, quick: bool = False, cluster: bool = False
         ) -> list[Scenario]:
    """The scenarios to run: ``names``, else the smoke subset, else every scenario of the
    path (the cluster's own, or every one-node scenario on the host harness)."""
    default = (QUICK if quick else CLUSTER_DEFAULT if cluster
               else [s.name for s in SCENARIOS if s.nodes == 1])
    return [s for s in SCENARIOS if s.name in (names or default)]
