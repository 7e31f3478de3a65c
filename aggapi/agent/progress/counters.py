"""The byte counters the progress engine records each poll, one per layer ingest,
and their book: the change points that ``rate`` measures (see its docstring), the
waits for a download slot, and when each download finished."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from aggapi.agent.progress.rate import GROUP_MAX_SPAN, Rates, Trace

MEMORY = 64  # change points kept per counter
FINISHED_MEMORY = GROUP_MAX_SPAN  # seconds a finished counter still counts in windows
SLACK = 1.05  # a step's rate may read this much over the link's before it is impossible


class Counter:
    """A byte counter's change points, bounded to MEMORY of them."""

    def __init__(self) -> None:
        self.points: deque[tuple[float, int]] = deque(maxlen=MEMORY)
        self.moves = 0
        self.exact_start = False
        self.finished_at: float | None = None
        self.total: int | None = None
        self.last_exact = False  # its last point is dated by the runtime, not a poll
        self.soft_start: float | None = None
        # Taken as waiting for a download slot, the time a completion freed one for it.
        self.slot_at: float | None = None
        self.slot_inferred = False  # slot_at from the node's slots being held, not the queue

    @property
    def value(self) -> int:
        return self.points[-1][1] if self.points else 0

    def observe(self, now: float, value: int, changed_at: float | None = None,
                started_at: float | None = None) -> None:
        """A poll at ``now`` saw ``value``; ``changed_at`` is when it last changed and
        ``started_at`` when the transfer began, if the runtime says (each ignored
        unless plausible)."""
        last = self.points[-1] if self.points else None
        exact = changed_at is not None and 0 < changed_at <= now + 1.0 and (
            last is None or changed_at >= last[0])
        t = min(changed_at, now) if exact and changed_at is not None else now
        if last is None or value < last[1]:
            # New, or a restarted transfer: old points say nothing of this one.
            self.points.clear()
            self.moves, self.exact_start, self.finished_at = 0, exact, None
            if started_at is not None and 0 < started_at <= t and (
                    last is None or started_at >= last[0]):
                # containerd opens the ingest just before it sends the GET: offset 0
                # at started_at is a real sample, so the first step already spans a
                # whole step's time (at 50 kB/s a 1 MiB step takes 21 s).
                self.points.append((started_at, 0))
                self.exact_start = True
                if value > 0:
                    self.points.append((t, value))
                    self.moves = 1
                return
            self.points.append((t, value))
            return
        if value == last[1]:
            return
        if self.moves == 0 and not self.exact_start:
            # The first point is only when a poll first saw it, not when it got there:
            # measuring from it would overstate the rate.
            self.points.clear()
        self.points.append((t, value))
        self.moves += 1
        self.last_exact = exact

    def queued_start(self, link: float | None) -> None:
        """Called at its first step: a download opened at offset 0 may have waited for
        one of the node's download slots (containerd opens the ingest, then waits: on
        2.x every pull on the node shares max_concurrent_downloads). If it was taken as
        waiting and got the slot a completion freed (``slot_at``), and its step could
        have come from there within the node's ``link`` rate, its start point is not
        when its bytes began: drop it, spread its first bytes from the slot, and
        measure its rate from this step on."""
        if (self.moves != 1 or len(self.points) != 2 or self.points[0][1] != 0
                or not link or self.slot_at is None):
            return
        (t0, _), (t1, v1) = self.points
        if t0 < self.slot_at < t1 and v1 / (t1 - self.slot_at) <= link * SLACK:
            self.points.popleft()
            self.moves, self.exact_start = 0, self.last_exact
            self.soft_start = self.slot_at
        else:
            self.slot_at, self.slot_inferred = None, False  # it ran from its start

    def finish(self, at: float, value: int | None) -> None:
        """Complete (committed) at ``at`` with ``value`` bytes."""
        if self.finished_at is not None:
            return
        last = self.points[-1] if self.points else None
        if value is not None and last is not None and value > last[1]:
            self.points.append((max(at, last[0]), value))
            self.moves += 1
        self.finished_at = at

    def frozen(self) -> Trace:
        return Trace(tuple(self.points), self.moves, self.finished_at is not None,
                     self.exact_start, self.soft_start, self.slot_at)


class CounterBook:
    """Counters by key (a layer's digest). Live ones are observed every poll;
    finished ones stay FINISHED_MEMORY seconds (they still count in group windows);
    the rest are dropped: memory is bounded by what the node downloads."""

    def __init__(self) -> None:
        self.counters: dict[str, Counter] = {}
        self._touched: set[str] = set()
        self.completions: deque[float] = deque(maxlen=MEMORY)
        self.link: float | None = None  # the node's link capacity, as last measured
        self.slots = 3  # downloads the node runs at once, as last seen (its owner sets it)
        self.queued: list[str] = []  # taken as waiting for a slot, first opened first

    def observe(self, key: str, now: float, value: int, changed_at: float | None = None,
                total: int | None = None, started_at: float | None = None) -> None:
        c = self.counters.get(key)
        if c is None or c.finished_at is not None:
            c = self.counters[key] = Counter()
        moved = c.moves
        c.observe(now, value, changed_at, started_at)
        if c.moves == 1 and moved == 0:
            c.queued_start(self.link)
        c.total = total if total and total > 0 else None
        self._touched.add(key)

    def sweep(self, now: float, finished: Mapping[str, float]) -> dict[str, float]:
        """Call once per poll after the observe()s. ``finished``: keys whose content is
        committed, with the commit time. A live counter no longer observed has finished
        (containerd keeps a failed download's ingest for a retry to resume): at its
        commit time if known, else now. Returns those that finished, with when."""
        done: dict[str, float] = {}
        for key in list(self.counters):
            c = self.counters[key]
            if key in self._touched:
                continue
            if c.finished_at is None:
                at = finished.get(key, now)
                last = c.points[-1][0] if c.points else at
                c.finish(min(max(at, last), now), c.total)
                done[key] = min(max(at, last), now)
                self.completions.append(done[key])
            elif now - c.finished_at > FINISHED_MEMORY:
                del self.counters[key]
        # Taken as waiting again: the slot inferred for it went to another after all.
        for key in self.queued:
            w = self.counters.get(key)
            if w is not None and w.slot_inferred and len(w.points) == 1:
                w.slot_at, w.slot_inferred = None, False
        # Each completion frees a slot for the download that waited longest.
        for at in sorted(done.values()):
            for key in self.queued:
                w = self.counters.get(key)
                if (w is not None and w.slot_at is None and w.finished_at is None
                        and w.points and w.points[0][0] < at):
                    w.slot_at = at
                    break
        self._infer_slots(now)
        self._touched.clear()
        return done

    def _infer_slots(self, now: float) -> None:
        """A download taken as running, open at offset 0 and not stepped, opened while
        the node's slots were all held by downloads that have since proved to be running
        (they stepped or finished), cannot have begun before one of them finished: it
        got the slot of the latest completion since (containerd 2.4 opens every ingest at
        once and the downloads race for the slots, so which one waits is known only
        when the others step)."""
        held = [(c.soft_start if c.soft_start is not None else c.points[0][0],
                 c.finished_at if c.finished_at is not None else now)
                for c in self.counters.values()
                if c.points and (c.moves or c.finished_at is not None)]
        queued = set(self.queued)  # these get the slot of the completion that frees one
        for key, c in self.counters.items():
            if (key in queued or c.finished_at is not None or c.slot_at is not None
                    or len(c.points) != 1 or c.points[0][1] != 0):
                continue
            t0 = c.points[0][0]
            if sum(1 for a, b in held if a <= t0 < b) < self.slots:
                continue
            later = [at for at in self.completions if t0 < at <= now]
            if later:
                c.slot_at, c.slot_inferred = max(later), True

    def snapshot(self, now: float) -> Rates:
        return Rates({k: c.frozen() for k, c in self.counters.items()},
                     {k: c.total for k, c in self.counters.items()}, now,
                     tuple(self.completions))

    def __len__(self) -> int:
        return len(self.counters)
