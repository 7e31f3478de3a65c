"""When each layer will be in: the node's link shared among the layers it downloads.

containerd downloads several layers at once (up to 3 per pull) over one link, and
every pull on the node shares it. So a layer's time left is not its bytes left over
its own rate: when a sibling finishes, its share of the link goes to the others, and
a pull's queued layers start as its running ones finish. ``plan`` plays that out: the
link's rate (the rate of all layer bytes the node downloads) is split among the
running layers in proportion to their measured rates (equally while unknown); at each
completion the finished layer's share is redistributed and its pull's next queued
layer starts. At most one step per layer, so the cost is bounded by their number.

Whether the link is really shared is measured (``Sharing``): when a layer finishes,
do the others speed up? Per-connection limits (a registry that throttles each
download on its own) say no, and then each layer keeps its own rate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from aggapi.agent.progress.rate import Rates, Trace


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


def plan(flows: Sequence[Flow], link: float | None, slots: Mapping[str, int],
         conserve: float = 1.0, node_slots: int | None = None) -> Plan:
    """Finish times of every flow on a link of ``link`` bytes per second; ``slots``
    is how many layers each pull downloads at once (1 when not given), ``node_slots``
    how many the whole node does (containerd 2.x shares its max_concurrent_downloads
    among all pulls; None: no such limit). Queued flows start in the order given.
    ``conserve`` is how much of a finished flow's rate the others take over: 1 on a
    shared link, 0 when each flow is limited on its own (then a queued flow adds its
    own rate)."""
    if not link or link <= 0 or not flows:
        return Plan({}, {})
    known = [f.weight for f in flows if f.weight and f.weight > 0]
    default = sum(known) / len(known) if known else 1.0
    lost = 1.0 - min(max(conserve, 0.0), 1.0)
    if lost and len(known) == sum(1 for f in flows if f.active):
        # Not (wholly) shared: what runs now is the sum of the running layers' own rates
        # (the link's recent rate may still count a layer that just finished).
        link = (1 - lost) * link + lost * sum(f.weight or 0.0 for f in flows if f.active)

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

    def start(pull: str, later: bool) -> float:
        """Start what the pull has room for; the rate they bring to the link."""
        added = 0.0
        q = queues.get(pull)
        while q and running.get(pull, 0) < max(slots.get(pull, 1), 1) and (
                node_slots is None or sum(running.values()) < node_slots):
            f = q.pop(0)
            left[f.key], w[f.key] = max(f.remaining, 0.0), weight(f)
            running[pull] = running.get(pull, 0) + 1
            added += lost * w[f.key] if later else 0.0
        return added

    order = list(queues)  # pulls by their first queued flow
    for pull in order:
        start(pull, False)
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
            link -= lost * rates[k]
            del left[k]
            running[pull_of[k]] -= 1
        # A freed slot goes to the pull that finished a layer, then (node-wide slots)
        # to any pull's queued layers, first queued first.
        for pull in [*{pull_of[k]: None for k in done}, *order]:
            link += start(pull, True)
        if left and link <= 0:
            break  # nothing left to carry the rest: unknown
    return Plan(finish, share)


class Sharing:
    """How much of a finished layer's rate the layers still running take over: 1 on a
    link they share (assumed until measured: one registry link), 0 when each download
    is limited on its own. Judged at each completion from the layers still running:
    their rates before it against their rates over two whole steps after it (a layer's
    rate across the completion mixes both; a guess at bytes in flight hides a speed-up)."""

    def __init__(self, prior: float = 1.0) -> None:
        self.conserve = prior
        self._pending: tuple[float, float, dict[str, float]] | None = None

    def finished(self, at: float, rate: float | None, others: Mapping[str, float | None],
                 ) -> None:
        """A layer that ran at ``rate`` finished at ``at``; ``others``: the layers
        running with it and their rates then. One still being judged is dropped (two
        completions together say nothing clear)."""
        before = {k: r for k, r in others.items() if r}
        self._pending = (at, rate, before) if rate and before else None

    def update(self, traces: Mapping[str, Trace], started: bool = False) -> None:
        """Judge once a layer still running has stepped twice since the completion.
        ``started``: a layer began since; it takes the freed share on any link, so
        nothing can be judged."""
        if started:
            self._pending = None
        if self._pending is None:
            return
        at, freed, before = self._pending
        gained = expected = 0.0
        total_before = sum(before.values())
        for k, r0 in before.items():
            tr = traces.get(k)
            if tr is None:
                continue
            after = [p for p in tr.points if p[0] > at]
            if len(after) < 3 or after[-1][0] <= after[0][0]:
                continue
            r1 = (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0])
            gained += r1 - r0
            expected += freed * r0 / total_before
        if expected > 0:
            self._pending = None
            self.conserve = min(max(gained / expected, 0.0), 1.0)


def share_rate(keys: Iterable[str], share: Mapping[str, float], rates: Rates
               ) -> float | None:
    """The rate of a set of layers (an image's, a pod's, a pull's): their shares of the
    link now, which move the moment a sibling or another pull finishes, where a rate
    measured over a window lags by that window. None unless one of them has a
    measured rate of its own: no rate is made up for bytes not yet seen."""
    mine = set(keys)
    if not any(k in share and rates.rate(k) is not None for k in mine):
        return None
    return sum(share[k] for k in mine if k in share)
