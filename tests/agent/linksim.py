"""A simulated node link for rate and ETA tests: layers of several pulls share one
token-bucket link, and containerd sees each layer's bytes in whole copy-buffer steps.

Shares are uneven and fixed per layer (TCP rarely splits a link evenly: issue 23
measured 221 vs 123 kB/s), a pull runs at most ``per_pull`` layers at once in manifest
order, and a finished layer's share goes to the layers still running. Everything is
computed exactly (piecewise-constant rates), so a test knows the true rate at any
moment and the true time each layer will finish.

``node_slots``: at most this many layers download at once on the whole node (containerd
2.x's transfer service shares max_concurrent_downloads among every pull). A layer
waiting for a slot already has its ingest, opened at offset 0 when its pull reached it:
its started_at is then earlier than its first byte.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class SimLayer:
    digest: str
    size: int
    weight: float  # its relative share of the link while it runs
    pull: str


@dataclass(frozen=True)
class Ingest:
    digest: str
    offset: int  # what containerd's ListStatuses shows: whole steps only
    updated_at: float  # when that offset was written
    started_at: float
    total: int
    pull: str


class SharedLink:
    def __init__(self, rate: float, layers: Sequence[SimLayer], per_pull: int = 3,
                 step: int = MiB, shared: bool = True, node_slots: int | None = None,
                 admit: Sequence[int] | None = None) -> None:
        """``shared=False``: no common link; each layer is limited on its own (a
        registry's per-connection limit) to ``weight`` bytes per second. ``admit``: the
        order (indexes into ``layers``) in which opened layers get a node slot; first
        opened first when not given (containerd 2.4's downloads race for its slots:
        the bench saw a 6-layer pull start layers 1, 3 and 6, then 4, 2, 5)."""
        self.admit = list(admit) if admit is not None else None
        self.shared = shared
        self.node_slots = node_slots
        self.opened: dict[str, float] = {}  # ingest opened (started_at)
        self.waiting: list[SimLayer] = []  # opened, waiting for a node slot
        self.rate = rate
        self.step = step
        self.per_pull = per_pull
        self.layers = {la.digest: la for la in layers}
        self.layers_list = list(layers)
        self.t = 0.0
        self.got: dict[str, float] = {}
        self.written: dict[str, tuple[int, float]] = {}
        self.started: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self._queues: dict[str, list[SimLayer]] = {}
        for la in layers:
            self._queues.setdefault(la.pull, []).append(la)
        for pull in self._queues:
            self._start(pull)
        self._admit()

    def _running(self, pull: str | None = None) -> list[SimLayer]:
        return [la for d, la in self.layers.items() if d in self.started
                and d not in self.done and (pull is None or la.pull == pull)]

    def _start(self, pull: str) -> None:
        q = self._queues[pull]
        while q and len(self._running(pull)) + sum(
                1 for w in self.waiting if w.pull == pull) < self.per_pull:
            la = q.pop(0)
            self.opened[la.digest] = self.t
            self.written[la.digest] = (0, self.t)
            self.waiting.append(la)

    def _admit(self) -> None:
        while self.waiting and (self.node_slots is None
                                or len(self._running()) < self.node_slots):
            i = 0
            if self.admit is not None:
                order = [self.layers_list[k].digest for k in self.admit]
                i = min(range(len(self.waiting)),
                        key=lambda j: order.index(self.waiting[j].digest))
            la = self.waiting.pop(i)
            self.started[la.digest] = self.t
            self.got[la.digest] = 0.0

    def shares(self) -> dict[str, float]:
        """Each running layer's rate now (bytes per second)."""
        run = self._running()
        if not self.shared:
            return {la.digest: la.weight for la in run}
        w = sum(la.weight for la in run)
        return {la.digest: self.rate * la.weight / w for la in run}

    def run_until(self, until: float) -> None:
        while self.t < until:
            rates = self.shares()
            if not rates:
                self.t = until
                return
            dt = min((self.layers[d].size - self.got[d]) / r for d, r in rates.items())
            t1 = min(until, self.t + dt)
            finishing = []
            for d, r in rates.items():
                size = self.layers[d].size
                got = self.got[d] + r * (t1 - self.t)
                if got >= size - 1e-6:
                    got = size
                    finishing.append(d)
                k = math.floor(got / self.step) * self.step
                if 0 < k < size and k > self.written[d][0]:
                    self.written[d] = (k, self.t + (k - self.got[d]) / r)
                self.got[d] = got
            self.t = t1
            for d in finishing:
                self.done[d] = t1
                self.written[d] = (self.layers[d].size, t1)
            for pull in {self.layers[d].pull for d in finishing}:
                self._start(pull)
            self._admit()

    def ingests(self) -> list[Ingest]:
        return [Ingest(la.digest, *self.written[la.digest], self.opened[la.digest],
                       la.size, la.pull) for la in self._running() + self.waiting]

    def finished(self) -> bool:
        return len(self.done) == len(self.layers)

    def finish_times(self) -> dict[str, float]:
        """Run a copy to the end: when each layer's last byte arrives."""
        twin = SharedLink(self.rate, list(self.layers.values()), self.per_pull, self.step,
                          self.shared, self.node_slots, self.admit)
        while not twin.finished():
            twin.run_until(twin.t + 3600.0)
        return dict(twin.done)


class RecordedLink:
    """A pull replayed from a bench run (tests/agent/traces/*.json): each layer's bytes
    as the bench's throttle proxy recorded them, reduced to the moments each whole step
    (containerd's 1 MiB) left it. Every layer's ingest is open from ``opened`` at offset
    0, as containerd 2.4 opens them, whatever order the downloads then start in.
    Same interface as SharedLink, so the same checks apply."""

    def __init__(self, trace: dict[str, object], digests: Sequence[str], pull: str,
                 step: int = MiB) -> None:
        layers = trace["layers"]
        assert isinstance(layers, list)
        self.step = step
        self.opened = float(trace.get("opened", 0.0))  # type: ignore[arg-type]
        self.points = {d: [(float(t), float(n)) for t, n in la["steps"]]
                       for d, la in zip(digests, layers, strict=True)}
        self.layers = {d: SimLayer(d, int(p[-1][1]), 1.0, pull)
                       for d, p in self.points.items()}
        self.t = 0.0
        self.got: dict[str, float] = {}
        self.written: dict[str, tuple[int, float]] = {d: (0, self.opened)
                                                       for d in self.points}
        self.done: dict[str, float] = {}

    def _at(self, d: str, t: float) -> tuple[float, float]:
        """Bytes at t and the rate then (linear between recorded steps)."""
        pts = self.points[d]
        if t <= pts[0][0]:
            return 0.0, 0.0
        for (ta, na), (tb, nb) in itertools.pairwise(pts):
            if t <= tb:
                r = (nb - na) / (tb - ta) if tb > ta else 0.0
                return na + r * (t - ta), r
        return pts[-1][1], 0.0

    def run_until(self, until: float) -> None:
        self.t = until
        for d, pts in self.points.items():
            self.got[d] = self._at(d, until)[0] if until > pts[0][0] else 0.0
            passed = [(t, n) for t, n in pts if t <= until]
            if passed and passed[-1][1] > 0:
                self.written[d] = (int(passed[-1][1]), passed[-1][0])
            if until >= pts[-1][0]:
                self.done.setdefault(d, pts[-1][0])

    def shares(self, window: float = 2.0) -> dict[str, float]:
        """Each layer's rate as the bench reads the truth: its bytes over the common
        window [t - window, t + window], clipped to the pull's first and last byte
        (the recorded steps are lumpy, and a layer's next GET starts a moment after
        the one before it ends: an instant's slopes are not the rate)."""
        first = min(p[0][0] for p in self.points.values())
        last = max(p[-1][0] for p in self.points.values())
        a, b = max(first, self.t - window), min(last, self.t + window)
        if b <= a:
            return {}
        out = {d: (self._at(d, b)[0] - self._at(d, a)[0]) / (b - a) for d in self.points}
        return {d: r for d, r in out.items() if r > 0}

    def ingests(self) -> list[Ingest]:
        return [Ingest(d, *self.written[d], self.opened, la.size, la.pull)
                for d, la in self.layers.items() if d not in self.done]

    def finished(self) -> bool:
        return len(self.done) == len(self.layers)

    def finish_times(self) -> dict[str, float]:
        return {d: p[-1][0] for d, p in self.points.items()}
