"""The node's link as the progress engine sees it: every layer ingest's byte counter,
the rates measured from them, whether the layers share one link (measured at
completions), which ingests wait for a download slot, and the plan of when each
layer's last byte comes (aggapi.agent.progress.eta). ``ContainerdBackend`` feeds it
one poll at a time and asks it to time its images and pulls."""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Mapping, Sequence
from dataclasses import replace

from aggapi.agent.progress.counters import CounterBook
from aggapi.agent.progress.eta import Flow, Plan, Sharing, plan, share_rate
from aggapi.agent.progress.model import (
    ALREADY_PRESENT,
    DOWNLOADING,
    EXTRACTING,
    WAITING,
    ImageState,
    LayerState,
    PullState,
)
from aggapi.agent.progress.peers import PeerBook
from aggapi.agent.progress.rate import Rates, Trace
from aggapi.linkpeers import PeerLink
from aggapi.runtime.containerd import IngestStatus

NODE_SLOTS = 3  # containerd's default max_concurrent_downloads
LINK_MEMORY = 60.0  # seconds of link rates kept for its capacity
# containerd's received bytes (sockbytes) are timed over the last RECEIVED_SPAN seconds
# of downloading, once they span RECEIVED_MIN (a registry's first chunk comes at once).
RECEIVED_SPAN, RECEIVED_MIN = 4.0, 1.0


class ReceivedMeter:
    """The rate of containerd's received-bytes count while layers download: the link
    before any layer has stepped twice. Samples start when the downloads do (a pull's
    manifest and config bytes, and the idle time before, are not the link's rate)."""

    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, wall: float, received: int | None, downloading: bool) -> None:
        if received is None or not downloading:
            self.samples.clear()
            return
        self.samples.append((wall, received))
        while len(self.samples) > 2 and wall - self.samples[1][0] >= RECEIVED_SPAN:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        if t1 - t0 < RECEIVED_MIN or b1 <= b0:
            return None
        return (b1 - b0) / (t1 - t0)


class LinkTiming:
    """The node's one link, across polls (the backend holds one)."""

    def __init__(self) -> None:
        self.counters = CounterBook()  # every layer ingest on the node, by digest
        # Layers the node downloads at once: containerd's max_concurrent_downloads
        # (default 3; shared by every pull on 2.x), raised when more are seen moving.
        self.counters.slots = NODE_SLOTS
        self.rates = self.counters.snapshot(0.0)
        self.slots: dict[str, int] = {}  # lease -> most layers seen downloading at once
        self.links: deque[tuple[float, float]] = deque()  # (time, link rate) measured
        self.sharing = Sharing()  # is the link shared? (measured at completions)
        self.last_est: dict[str, float | None] = {}  # each layer's likely rate, last poll
        self.idle: set[str] = set()  # layer ingests open at offset 0, last poll
        self.received = ReceivedMeter()  # containerd's TCP bytes, when readable
        self.peers = PeerBook()  # other nodes' pulls on this link (the leader's word)
        self.room: float | None = None  # the node's rate cap, last plan (see plan)

    def record(self, statuses: Sequence[IngestStatus], ingests: Mapping[str, IngestStatus],
               wall: float, created: Mapping[str, float]) -> dict[str, float]:
        """One poll's ingests; ``created``: when committed content was created. Returns
        the layer ingests taken as waiting for a slot, with when each was opened."""
        for s in statuses:
            if s.kind == "layer" and s.digest:
                # updated_at is the data file's mtime: when the last step landed.
                self.counters.observe(s.digest, wall, s.offset, s.updated_at or None,
                                      s.total, s.started_at or None)
        done = self.counters.sweep(wall, created)
        self.rates = self.counters.snapshot(wall)
        waiting = self.unstarted(ingests)
        self.counters.queued = sorted(waiting, key=lambda d: waiting[d])
        rates = self.rates = replace(self.rates, queued=frozenset(waiting))
        for digest, at in sorted(done.items(), key=lambda x: x[1]):
            self.sharing.finished(at, self.last_est.get(digest),
                                  {k: r for k, r in self.last_est.items() if k not in done})
        live = {d for d, ing in ingests.items() if ing.kind == "layer"}
        # A layer began since: a new ingest, or one open at offset 0 that moved
        # (containerd 2.4 opens every layer's ingest at once, then each waits for a
        # download slot: the one a completion frees goes to such a layer at once).
        began = bool(live - self.last_est.keys()) or any(
            d in self.idle and _moved(rates.traces.get(d)) for d in live)
        self.sharing.update(rates.traces, started=began)
        self.idle = {d for d in live if not _moved(rates.traces.get(d))}
        return waiting

    def measure(self, wall: float, received: int | None = None) -> float | None:
        """The node's link rate now (None: nothing to measure). ``received``: the bytes
        containerd has received over TCP so far, when they can be read."""
        rates = self.rates
        downloading = any(not tr.finished and tr.points and k not in rates.queued
                          for k, tr in rates.traces.items())
        self.received.add(wall, received, downloading)
        # On a shared link a completion hands its share to the others: the link's rate
        # is measured across it (the survivors' faster bytes show only at their next
        # steps, up to ~8 s later at 120 kB/s; restarting the window there read 60%).
        link = rates.group(rates.traces, whole_link=self.sharing.conserve >= 0.5)
        if link:
            # The link's capacity, for judging whether a step could have come from a
            # completion: its best rate of the last minute (while downloads wait for
            # slots, what is measured is only what runs). Steps only: a registry's
            # first chunk at once makes the received bytes' first seconds read high.
            self.links.append((wall, link))
        while self.links and wall - self.links[0][0] > LINK_MEMORY:
            self.links.popleft()
        self.counters.link = max((x for _, x in self.links), default=None)
        # The bytes containerd received, when they can be read, say what the link
        # carries now, steps or not: before the first step, and within seconds of a
        # change nothing on this node shows (another node's pull on the link ended).
        return (self.received.rate() if downloading else None) or link

    def forget_leases(self, live: Container[str]) -> None:
        for lease in list(self.slots):
            if lease not in live:
                del self.slots[lease]


    def plan(self, pull_layers: Mapping[str, tuple[LayerState, ...]],
              ingests: Mapping[str, IngestStatus], link: float | None,
              waiting: Mapping[str, float], wall: float | None = None) -> Plan:
        """Seconds until each layer's last byte, and each running layer's share of the
        link now: the link shared among every layer the node downloads, queued layers
        of a pull starting as its running ones finish. Twice: when a sibling finished
        within the steps a layer's rate is measured over, its bytes in flight since its
        last step come at its new share of the link, where that rate lags (l3-400k's
        6 MiB layer, just before the step at half its bytes: 19.6 s said, 15.6 s left)."""
        rates = self.rates
        est = self.last_est = rates.estimates(d for d, ing in ingests.items()
                                               if ing.kind == "layer")
        for lease, layers in pull_layers.items():
            running = sum(1 for la in layers if la.digest in ingests)
            self.slots[lease] = max(self.slots.get(lease, 0), running)
        pace = self._unstepped_pace(est, waiting, link)
        peers = None if wall is None else self.peers.current(wall)
        extra, whole = _peer_flows(peers), _whole_link(link, peers)
        # A peer's end frees its share as a sibling's end does: the bytes in flight
        # since come at the new share (its rate over whole steps lags it ~a step).
        ends = () if wall is None else self.peers.ends(wall)
        flowing = replace(rates, completions=rates.completions + ends) if ends else rates
        # Peers' flows run on their own nodes' download slots, not this node's.
        slots = self.counters.slots + len(extra)
        flows = self._flows(pull_layers, ingests, waiting, pace, flowing)
        first = plan(_paced(flows, pace, extra, link, flowing) + extra, whole, self.slots,
                     self.sharing.conserve, slots)
        if first.share:
            flows = self._flows(pull_layers, ingests, waiting, pace, flowing, first.share)
            first = plan(_paced(flows, pace, extra, link, flowing) + extra, whole,
                         self.slots, self.sharing.conserve, slots)
        # What the node may take now: with peers told, the whole link less their
        # shares (its own measured rate lags the share a peer's end freed).
        self.room = link if peers is None else max(link or 0.0, (whole or 0.0) - sum(
            v for k, v in first.share.items() if k.startswith(PEER))) or link
        if not extra:
            return first
        return Plan({k: v for k, v in first.finish.items() if not k.startswith(PEER)},
                     {k: v for k, v in first.share.items() if not k.startswith(PEER)})

    def _unstepped_pace(self, est: Mapping[str, float | None], waiting: Mapping[str, float],
                        link: float | None) -> dict[str, float | None]:
        """``est`` with the layers that run but have not stepped paced by what the link
        leaves them: its rate less the stepped layers' rates, split evenly. (Another
        layer's rate is no guide: shares are uneven, 221 vs 123 kB/s in issue 23.)"""
        unstepped = [d for d in est if d not in waiting and self.rates.unstepped(d)]
        if not unstepped or not link:
            return dict(est)
        used = sum(r or 0.0 for d, r in est.items() if d not in waiting and d not in unstepped)
        each = max(link - used, 0.0) / len(unstepped)
        return {**est, **dict.fromkeys(unstepped, each)}

    def _flows(self, pull_layers: Mapping[str, tuple[LayerState, ...]],
               ingests: Mapping[str, IngestStatus], waiting: Mapping[str, float],
               pace: Mapping[str, float | None], rates: Rates,
               share: Mapping[str, float] | None = None) -> list[Flow]:
        """Every layer the node still downloads, its bytes in flight at ``pace`` (and at
        its ``share`` of the link since a sibling or a peer's pull finished: ``rates``'
        completions)."""
        share = share or {}
        flows: list[Flow] = []
        seen: set[str] = set()
        for lease, layers in pull_layers.items():
            for la in layers:
                if la.digest in seen:
                    continue
                if la.digest in ingests:
                    seen.add(la.digest)
                    left = la.total - la.progress - rates.in_flight(
                        la.digest, pace.get(la.digest), share.get(la.digest))
                    flows.append(Flow(la.digest, lease, left, self._weight(la.digest, waiting),
                                      la.digest not in waiting))
                elif la.phase == WAITING:
                    seen.add(la.digest)
                    flows.append(Flow(la.digest, lease, la.total, None, False))
        for digest, ing in ingests.items():
            if ing.kind == "layer" and digest not in seen and ing.total > 0:
                # A layer of a pull not resolved (yet): it shares the link all the same.
                left = ing.total - ing.offset - rates.in_flight(digest, pace.get(digest),
                                                                share.get(digest))
                flows.append(Flow(digest, "", left, self._weight(digest, waiting),
                                  digest not in waiting))
        # Running first; then the ingests waiting for a slot, first opened first; then
        # layers not reached yet (stable: in their pull's order).
        flows.sort(key=lambda f: (f.active, f.key in waiting, -waiting.get(f.key, 0.0)),
                   reverse=True)
        return flows

    def _weight(self, digest: str, waiting: Mapping[str, float]) -> float | None:
        """A layer's share of the link: its measured rate once it has stepped twice;
        until then unknown (the plan gives it the mean share). A bound from a layer
        that has not stepped yet (one step over the time since it opened) is no share:
        it may have waited for a slot all that time, and shrinks while it waits."""
        return None if digest in waiting else self.rates.rate(digest)

    def unstarted(self, ingests: Mapping[str, IngestStatus]) -> dict[str, float]:
        """Layer ingests open at offset 0 that have not stepped and for which no
        download slot is free: containerd 2.x opens a layer's ingest, then waits for one
        of the node's slots, so such an ingest may be queued. Those beyond the free
        slots (latest opened last) are taken as queued, with when they were opened."""
        traces = self.rates.traces
        moving: list[str] = []
        idle: list[tuple[float, str]] = []
        for d, ing in ingests.items():
            tr = traces.get(d)
            if ing.kind != "layer" or tr is None or tr.finished or not tr.points:
                continue
            if len(tr.points) == 1 and tr.points[0][1] == 0:
                idle.append((tr.points[0][0], d))
            else:
                moving.append(d)
        self.counters.slots = max(self.counters.slots, len(moving))
        idle.sort()
        free = max(self.counters.slots - len(moving), 0)
        return {d: t for t, d in idle[free:]}

    def timed(self, st: ImageState, timing: Plan, link: float | None) -> ImageState:
        """An image with its layers' shares of the link and ETAs, its own rate (the rate
        of its bytes) and its ETA (its last layer's)."""
        if st.phase not in (DOWNLOADING, EXTRACTING) or not st.layers:
            return st
        layers: list[LayerState] = []
        last: float | None = 0.0
        for la in st.layers:
            if la.phase in (DOWNLOADING, WAITING) and la.progress < la.total:
                at = timing.finish.get(la.digest)
                last = None if at is None or last is None else max(last, at)
                rate = la.bytes_per_second
                if rate is not None and link is not None:
                    rate = min(rate, link)
                la = replace(la, bytes_per_second=_round(rate),
                             eta_seconds=None if at is None else round(at, 1))
            layers.append(la)
        mine = [la.digest for la in st.layers if la.phase != ALREADY_PRESENT]
        rate = share_rate(mine, timing.share, self.rates)
        if rate is None:
            rate = self.rates.group(mine)
        if rate is not None and link is not None:
            rate = min(rate, link)
        if st.total is None:
            last = None
        return replace(st, layers=tuple(layers), bytes_per_second=_round(rate),
                       eta_seconds=None if last is None else round(last, 1))

    def timed_pull(self, p: PullState, layers: tuple[LayerState, ...],
                    link: float | None, timing: Plan) -> PullState:
        """A pull with its rate (its layers' share of the link) and its ETA (when its
        last layer still to come is planned to end; null if any such is not known)."""
        if not layers:
            return p
        mine = [la.digest for la in layers if la.phase != ALREADY_PRESENT]
        rate = share_rate(mine, timing.share, self.rates)
        if rate is None:
            rate = self.rates.group(mine)
        if rate is not None and link is not None:
            rate = min(rate, link)
        left = [timing.finish.get(la.digest) for la in layers
                if la.phase in (DOWNLOADING, WAITING) and la.progress < la.total]
        eta = None if not left or None in left else max(x for x in left if x is not None)
        return replace(p, bytes_per_second=_round(rate),
                       eta_seconds=None if eta is None else round(eta, 1))


PEER = "peer:"  # flow keys of other nodes' pulls (a digest starts with its algorithm)


def _peer_flows(peers: PeerLink | None) -> list[Flow]:
    """Each of the other nodes' pulls on the link: one running flow at its rate now
    (its own layers' split is theirs to plan; what matters here is when its share
    frees up)."""
    if peers is None:
        return []
    return [Flow(f"{PEER}{node}:{i}", f"{PEER}{node}", p.remaining, p.rate or None, True)
            for node, pulls in sorted(peers.peers.items())
            for i, p in enumerate(pulls) if p.remaining > 0]


def _paced(flows: list[Flow], pace: Mapping[str, float | None], extra: list[Flow],
           link: float | None, rates: Rates) -> list[Flow]:
    """With peers' flows on the link, a running layer not measured yet weighs what the
    node's own link leaves it (``pace``), not the flows' mean share: a peer's pull is
    one flow at the rate of all its layers, whose mean would give this node too much.
    And once a completion (a sibling's or a peer's end) falls within the steps a running
    layer's rate is measured over, the node's running layers weigh together what its
    link carries now (``link``: containerd's received bytes when readable), split by
    their measured rates: such a rate lags the share the completion handed over, while
    a peer's told rate is its share now. Weighed against each other they gave the node
    the lagged rate's part of the link, and as each node's share is the rate its peer is
    told, both settled there (2nodes-400k at 75%: 151-161 kB/s said, 200 kB/s real).
    Not always: the node's link is measured over a few seconds of bytes, noisier than
    whole steps while nothing changed."""
    if not extra:
        return flows
    out = [replace(f, weight=pace.get(f.key)) if f.weight is None and f.active else f
           for f in flows]
    running = [f for f in out if f.active]
    weights = [f.weight for f in running if f.weight is not None and f.weight > 0]
    if link and running and len(weights) == len(running) and any(
            rates.lags(f.key) for f in running):
        k = link / sum(weights)
        out = [replace(f, weight=f.weight * k) if f.active and f.weight else f for f in out]
    return out


def _whole_link(link: float | None, peers: PeerLink | None) -> float | None:
    """The rate of the whole link the flows share: this node's rate plus its peers';
    the leader's total when higher (just after a peer's end, this node's rate has not
    caught up yet with the share it gets now)."""
    if peers is None:
        return link
    own = (link or 0.0) + sum(p.rate for pulls in peers.peers.values() for p in pulls
                              if p.remaining > 0)
    return max(own, peers.total or 0.0) or link


def _moved(tr: Trace | None) -> bool:
    return tr is not None and bool(tr.points) and tr.points[-1][1] > 0


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
