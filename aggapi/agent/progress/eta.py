"""When each layer will be in: the node's link shared among the layers it downloads.

containerd downloads several layers at once (up to 3 per pull) over one link, and
every pull on the node shares it. So a layer's time left is not its bytes left over
its own rate: when a sibling finishes, its share of the link goes to the others, and
a pull's queued layers start as its running ones finish. ``plan`` plays that out: the
link's rate (the rate of all layer bytes the node downloads) is split among the
running layers in proportion to their measured rates (equally while unknown); at each
completion the finished layer's share is redistributed and its pull's next queued
layer starts. At most one step per layer, so the cost is bounded by their number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Flow:
    """One layer the node still has bytes of to download."""

    key: str  # the layer's digest
    pull: str  # the pull (lease) it belongs to; "" when unknown
    remaining: float  # bytes still to come
    weight: float | None  # its measured rate (a relative share); None = not known yet
    active: bool  # downloading now; False = queued behind its pull's running layers


@dataclass(frozen=True)
class Plan:
    finish: Mapping[str, float]  # key -> seconds from now until its last byte
    share: Mapping[str, float]  # key -> bytes per second it gets now


def plan(flows: Sequence[Flow], link: float | None, slots: Mapping[str, int]) -> Plan:
    """Finish times of every flow on a link of ``link`` bytes per second; ``slots``
    is how many layers each pull downloads at once (1 when not given)."""
    if not link or link <= 0 or not flows:
        return Plan({}, {})
    known = [f.weight for f in flows if f.weight and f.weight > 0]
    default = sum(known) / len(known) if known else 1.0

    def weight(f: Flow) -> float:
        return f.weight if f.weight and f.weight > 0 else default

    left: dict[str, float] = {}
    w: dict[str, float] = {}
    pull_of: dict[str, str] = {}
    queues: dict[str, list[Flow]] = {}
    running: dict[str, int] = {}
    for f in flows:
        pull_of[f.key] = f.pull
        if f.active:
            left[f.key], w[f.key] = max(f.remaining, 0.0), weight(f)
            running[f.pull] = running.get(f.pull, 0) + 1
        else:
            queues.setdefault(f.pull, []).append(f)

    def start(pull: str) -> None:
        q = queues.get(pull)
        while q and running.get(pull, 0) < max(slots.get(pull, 1), 1):
            f = q.pop(0)
            left[f.key], w[f.key] = max(f.remaining, 0.0), weight(f)
            running[pull] = running.get(pull, 0) + 1

    for pull in list(queues):
        start(pull)
    total_w = sum(w.values())
    share = {k: link * w[k] / total_w for k in left} if total_w else {}
    finish: dict[str, float] = {}
    t = 0.0
    while left:
        total_w = sum(w[k] for k in left)
        rates = {k: link * w[k] / total_w for k in left}
        dt = min(left[k] / rates[k] for k in left)
        t += dt
        done = [k for k in left if left[k] - rates[k] * dt <= 1e-6 * max(left[k], 1.0)]
        for k in left:
            left[k] -= rates[k] * dt
        for k in done:
            finish[k] = t
            del left[k]
            running[pull_of[k]] -= 1
        for pull in {pull_of[k] for k in done}:
            start(pull)
    return Plan(finish, share)
