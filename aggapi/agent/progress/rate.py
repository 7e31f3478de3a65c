"""Rates of byte counters that move in steps, and of groups of them.

containerd 2.x's transfer service copies with a 1 MiB buffer, so an ingest's offset
moves in 1 MiB steps: at 120 kB/s once every ~8 s. containerd 1.6 moves smoothly. A
window of fixed length over poll samples therefore measures the step size over the
window, not the rate. What does tell the rate is *when* the counter changed: the
ingest's ``updated_at`` (the mtime of its data file, i.e. the moment of the last
write) when containerd gives one, else the poll that saw the change.

So a counter keeps its change points (time, value) and is measured over whole steps:
from one change to a later one, over a span that grows until it covers several
changes and a minimum time, or over the last few changes when those clearly disagree
with the longer span (the rate changed). A counter that has not moved twice has no
rate. A counter overdue for its next step decays: no more than (bytes + one step) /
(time since the span began), the most that is consistent with no step having come.

A group of counters (an image's layers, a pod's images, every layer the node
downloads) is measured over one common window, each counter read off its own
piecewise-linear curve through its change points: steps of different counters fall at
different moments, so counting whole steps of a sum would be off by up to a step per
counter.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MIN_CHANGES, MIN_SPAN = 2, 2.0  # the shortest span a rate is measured over
LONG_CHANGES, LONG_SPAN = 6, 10.0  # the span used while the rate holds steady
CHANGED = 0.25  # short and long spans disagreeing by more than this: the rate changed
GROUP_MIN_SPAN, GROUP_MAX_SPAN = 4.0, 60.0
IDLE_GAP = 2.0  # seconds between downloads that make them separate busy spells
# containerd 2.x's copy buffer: the step a download takes before any step is seen (only
# a link measured some other way, aggapi.agent.progress.sockbytes, times layers then).
COPY_BUFFER = 1 << 20


@dataclass(frozen=True)
class Trace:
    """One counter's change points, frozen for one poll's computations."""

    points: tuple[tuple[float, int], ...]  # (time, value), oldest first
    moves: int  # changes seen (the first point, a mere observation, is not one)
    finished: bool = False  # complete: its value will not move again
    exact_start: bool = False  # the first point is when it got there, not when seen
    # When it likely began, if not its first point (a download that may have waited
    # for a slot): its first bytes are spread from then, in group windows only.
    soft_start: float | None = None
    slot_at: float | None = None  # when a slot freed for it, if it waited for one

    @property
    def step(self) -> int:
        """The size of its last step (its typical one: containerd's copy buffer)."""
        if len(self.points) < 2:
            return 0
        return self.points[-1][1] - self.points[-2][1]

    def rate(self, now: float) -> float | None:
        """Bytes per second over whole steps; None until it has moved twice, or once
        from a known start (its first point is when it began, not when first seen)."""
        pts = self.points
        if self.moves < (1 if self.exact_start else 2) or len(pts) < 2:
            return None
        t_last, v_last = pts[-1]
        start = _span_start(pts, MIN_CHANGES, MIN_SPAN)
        short = _between(pts[start], pts[-1])
        long_start = _span_start(pts, LONG_CHANGES, LONG_SPAN)
        long = _between(pts[long_start], pts[-1])
        if short is None:
            return None
        if long and abs(short / long - 1) <= CHANGED:
            start, rate = long_start, long
        else:
            rate = short
        if not self.finished and now > t_last:
            # Overdue: had the next step come just now, this would be the rate.
            t0, v0 = pts[start]
            rate = min(rate, (v_last - v0 + self.step) / (now - t0))
        return rate

    def value_at(self, t: float, rate: float | None, total: int | None = None,
                 step_hint: int = 0) -> float:
        """Bytes at time t, read off the line through the change points. After the last
        one: the bytes in flight since, at ``rate``, never more than one step (its own,
        or ``step_hint`` before it has one) nor past ``total``; before the first: its
        first value."""
        pts = self.points
        if not pts:
            return 0.0
        t_last, v_last = pts[-1]
        if t >= t_last:
            if self.finished or not rate:
                return float(v_last)
            extra = min(rate * (t - t_last), float(max(self.step or step_hint, 0)))
            if total is not None:
                extra = min(extra, float(max(total - v_last, 0)))
            return v_last + extra
        i = bisect_right(pts, (t, float("inf")))
        if i == 0:
            t0, v0 = pts[0]
            if self.soft_start is not None and self.soft_start < t0:
                return v0 * max(t - self.soft_start, 0.0) / (t0 - self.soft_start)
            if self.exact_start or not rate:
                return float(v0)
            # First seen mid-transfer: it was moving before, at about this rate.
            return max(v0 - rate * (t0 - t), 0.0)
        (ta, va), (tb, vb) = pts[i - 1], pts[i]
        return va + (vb - va) * (t - ta) / (tb - ta) if tb > ta else float(vb)


def _span_start(pts: tuple[tuple[float, int], ...], changes: int, span: float) -> int:
    """Index of the newest point at least ``changes`` changes and ``span`` seconds
    before the last (or the oldest point there is)."""
    j = max(len(pts) - 1 - changes, 0)
    t_last = pts[-1][0]
    while j > 0 and t_last - pts[j][0] < span:
        j -= 1
    return j


def _between(a: tuple[float, int], b: tuple[float, int]) -> float | None:
    return (b[1] - a[1]) / (b[0] - a[0]) if b[0] > a[0] else None


OVERDUE = 1.2  # past this many steps' time at its pace, a layer is slower than that


@dataclass(frozen=True)
class Rates:
    """Every counter of one poll, frozen: rates of single counters and of groups."""

    traces: Mapping[str, Trace]
    totals: Mapping[str, int | None]
    now: float
    completions: tuple[float, ...] = ()  # when the node's recent downloads finished
    queued: frozenset[str] = frozenset()  # counters taken as waiting for a slot

    def rate(self, key: str) -> float | None:
        tr = self.traces.get(key)
        return None if tr is None or tr.finished else tr.rate(self.now)

    def estimates(self, keys: Iterable[str]) -> dict[str, float | None]:
        """Each live counter's likely rate, for sharing the link and for bytes in flight
        (never shown as a rate): its rate once it has moved twice; before that, from
        its start if its first point is its start (the first step over the time it
        took; with no step yet, no more than one step over the time since, nor more
        than the others' mean). None when nothing is known."""
        out: dict[str, float | None] = {}
        unmoved: list[str] = []
        step = max((t.step for t in self.traces.values()), default=0)
        for k in keys:
            tr = self.traces.get(k)
            if tr is None or tr.finished or not tr.points:
                continue
            if tr.moves >= 2:
                out[k] = tr.rate(self.now)
            elif tr.exact_start and len(tr.points) == 2 and tr.moves == 1:
                (t0, v0), (t1, v1) = tr.points
                out[k] = min((v1 - v0) / (t1 - t0),
                             (v1 - v0 + tr.step) / (self.now - t0)) if t1 > t0 else None
            elif len(tr.points) == 1 and (tr.exact_start or tr.moves):
                # Its one point is a change (its start, or its first step): it has
                # not stepped since.
                unmoved.append(k)
            else:
                out[k] = None
        known = [r for r in out.values() if r]
        mean = sum(known) / len(known) if known else None
        for k in unmoved:
            # It may have waited for a download slot.
            t0 = self.began(self.traces[k])
            bound = step / (self.now - t0) if step and self.now > t0 else None
            out[k] = min(x for x in (bound, mean) if x is not None) if (bound or mean) else None
        return out

    def in_flight(self, key: str, estimate: float | None, share: float | None = None
                  ) -> float:
        """Bytes received since the counter's last step, at ``estimate`` (its likely
        rate): never more than one step. When a download finished within the steps
        its rate is measured over, that rate lags: from the completion on, the bytes
        come at ``share`` (its share of the link now) if given. One that has not
        stepped since it began (or since its slot freed) gets ``estimate`` for the
        time since it began, short of the step it has not taken (taking the middle of
        the step froze its ETA for the step's whole time: l6-400k's 2 MiB layer said
        11.7 s at its first step, with 7.9 s left)."""
        tr = self.traces.get(key)
        if tr is None or not tr.points or key in self.queued:
            return 0.0
        hint = self._step_hint()
        extra = tr.value_at(self.now, estimate, self.totals.get(key), hint) - tr.points[-1][1]
        if len(tr.points) > 1:
            done = self._done_since_span(tr)
            if not share or not estimate or not done or tr.finished:
                return extra
            t_last, v_last = tr.points[-1]
            at = max(max(done), t_last)
            total = self.totals.get(key)
            cap = float(tr.step or hint) if total is None else min(
                float(tr.step or hint), float(total - v_last))
            return min(estimate * (at - t_last) + share * (self.now - at), cap)
        total = self.totals.get(key)
        room = hint - 1.0 if total is None else min(hint - 1.0, total - tr.points[-1][1] - 1.0)
        elapsed = max(self.now - self.began(tr), 0.0)
        typical = self._typical_rate(key) or estimate
        if not estimate or not typical or not hint or typical * elapsed > OVERDUE * room:
            # Long past the step it would have taken at the others' pace: slower than
            # they are (shares are uneven), so anywhere within the step.
            return min(extra, hint / 2)
        return max(min(estimate * elapsed, room), 0.0)

    def lags(self, key: str) -> bool:
        """A live counter whose rate, over its last steps, spans a download's completion
        on the link: it shows its share from before, not the one it gets since."""
        tr = self.traces.get(key)
        return (tr is not None and not tr.finished and len(tr.points) > 1
                and bool(self._done_since_span(tr)))

    def _done_since_span(self, tr: Trace) -> list[float]:
        """Completions since the start of the span its rate is measured over."""
        since = tr.points[max(len(tr.points) - 1 - MIN_CHANGES, 0)][0]
        return [at for at in self.completions if since < at <= self.now]

    def _typical_rate(self, key: str) -> float | None:
        """The mean measured rate of the other live counters."""
        known = [r for k, t in self.traces.items()
                 if k != key and not t.finished and (r := t.rate(self.now))]
        return sum(known) / len(known) if known else None

    def unstepped(self, key: str) -> bool:
        """Live and not stepped since it began (or since its slot freed)."""
        tr = self.traces.get(key)
        return tr is not None and not tr.finished and len(tr.points) == 1

    def _step_hint(self) -> int:
        return max((t.step for t in self.traces.values()), default=0) or COPY_BUFFER

    def span(self, keys: Iterable[str], minimum: float = GROUP_MIN_SPAN) -> float:
        """The window a group is measured over: two of its slowest live counter's
        steps, within [minimum, GROUP_MAX_SPAN]."""
        longest = 0.0
        for k in keys:
            t = self.traces.get(k)
            if t is None or t.finished or not t.points:
                continue
            if len(t.points) >= 2:
                longest = max(longest, t.points[-1][0] - t.points[-2][0])
            if k in self.queued:
                continue  # not downloading: its idle time says nothing of a step
            longest = max(longest, self.now - self.began(t))
        return min(max(2 * longest, minimum), GROUP_MAX_SPAN)

    def began(self, t: Trace) -> float:
        """Its last point's time; for one opened at offset 0 that has not stepped and
        was taken as waiting for a download slot, when a completion freed one for it."""
        t0 = t.points[-1][0]
        if len(t.points) == 1 and t.points[0][1] == 0 and t.slot_at is not None:
            return max(t0, t.slot_at)
        return t0

    def group(self, keys: Iterable[str], since: float | None = None,
              until: float | None = None, whole_link: bool = False) -> float | None:
        """Bytes per second of the counters' bytes together, over one common window
        (or over [since, until] when given). ``whole_link``: the keys are every
        download on a shared link, whose total does not change when one finishes."""
        trs = {k: t for k in set(keys) if (t := self.traces.get(k)) is not None and t.points}
        live = [t.soft_start if t.soft_start is not None else t.points[0][0]
                for t in trs.values() if not t.finished]
        if live:
            # A counter that finished well before every live one began is an earlier
            # pull's: the node was idle between them, and that is not the link's rate.
            # (One whose slot a queued layer took is not: that one began as it ended.)
            trs = {k: t for k, t in trs.items()
                   if not t.finished or t.points[-1][0] > min(live) - IDLE_GAP}
        # Fewer than two steps say nothing, unless each counter has stepped from its
        # known start (one step of one of several leaves the others' pace unknown).
        if ((sum(t.moves for t in trs.values()) < 2
                and not all(t.exact_start and t.moves for t in trs.values()))
                or all(len(t.points) < 2 for t in trs.values())):
            return None
        first = min(t.points[0][0] for t in trs.values())
        start = max(self.now - self.span(trs), first, since or first)
        # One of them finished: on a shared link the others' shares changed then, so
        # the window starts after it once that leaves GROUP_MIN_SPAN.
        done = [t.points[-1][0] for t in trs.values() if t.finished]
        if since is None and done and not whole_link and self.now - max(done) >= GROUP_MIN_SPAN:
            start = max(start, max(done))
        end = self.now if until is None else min(until, self.now)
        if end <= start:
            return None
        est = self.estimates(trs)
        hint = self._step_hint()
        moved = 0.0
        for k, t in trs.items():
            r, total = est.get(k), self.totals.get(k)
            if k in self.queued:
                continue  # waiting for a download slot: no bytes in flight
            if len(t.points) == 1 and t.points[0][1] == 0:
                # Not stepped yet: its bytes in flight since it can have begun.
                if r:
                    s0, cap = self.began(t), float(t.step or hint)
                    moved += (min(r * max(end - s0, 0.0), cap)
                              - min(r * max(start - s0, 0.0), cap))
                continue
            moved += t.value_at(end, r, total, hint) - t.value_at(start, r, total, hint)
        return moved / (end - start)
