"""Follow the image pulls of many pods at once (a workload, a selector, a node, -A).

Every selected pod comes from one list and watch of ``podimagepulls``
(``aggapi.plugins.collection``): one PodImagePull per pod, however many pods there
are. Each pod is in one of four states, shown in this order: stuck (a pull Failed or
in BackOff, or Downloading with no new bytes for ``STALL_SECONDS``), waiting for a
pull slot, pulling (longest ETA first), done. The header sums them up and names the
slowest nodes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aggapi.client.connection import Connection
from aggapi.plugins.collection import Change, OnRetry, follow_collection
from aggapi.plugins.pacing import STALL_SECONDS
from aggapi.plugins.sanitize import clean
from aggapi.plugins.targets import Target

PRESENT = ("Done", "AlreadyPresent")
FAILED = ("Failed", "BackOff")
# kubelet never retries these: a pod with one is over (failed), not stuck for a while.
PERMANENT = ("InvalidImageName", "ErrImageNeverPull")
STUCK, WAITING, PULLING, DONE = 0, 1, 2, 3
STATE_NAMES = {STUCK: "stuck", WAITING: "waiting for a slot", PULLING: "pulling",
               DONE: "done"}
REDRAW_EVERY = 0.25  # at most this often: a rollout's events arrive in bursts
Obj = dict[str, Any]


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Image:
    container: str
    image: str
    phase: str
    progress: int | None
    total: int | None
    reason: str


@dataclass
class PodRow:
    """One pod's PodImagePull as shown; server text already cleaned."""

    name: str  # namespace/name
    node: str = ""
    phase: str = "Unknown"
    progress: int | None = None
    total: int | None = None
    rate: float | None = None
    eta: float | None = None
    images: tuple[Image, ...] = ()
    moved_at: float = 0.0  # when its bytes (or phase) last changed, by the clock

    @property
    def present(self) -> int:
        return sum(i.phase in PRESENT for i in self.images)

    @property
    def done(self) -> bool:
        return bool(self.images) and self.present == len(self.images)

    @property
    def reason(self) -> str:
        return "; ".join(f"{i.container}: {i.reason}" for i in self.images if i.reason)

    @property
    def permanent(self) -> bool:
        return any(i.phase in FAILED and any(p in i.reason for p in PERMANENT)
                   for i in self.images)

    def stalled(self, now: float) -> bool:
        return any(i.phase == "Downloading" for i in self.images) and \
            now - self.moved_at >= STALL_SECONDS

    def state(self, now: float) -> int:
        if self.done:
            return DONE
        if any(i.phase in FAILED for i in self.images) or self.stalled(now):
            return STUCK
        if any(i.phase == "Waiting" for i in self.images):
            return WAITING
        return PULLING

    def shown_phase(self, now: float) -> str:
        return "Stalled" if not self.done and self.stalled(now) and \
            self.phase == "Downloading" else self.phase


def row_order(row: PodRow, now: float) -> tuple[int, float, str]:
    """Stuck, waiting, pulling by ETA descending (unknown ETA last), done; by name."""
    st = row.state(now)
    eta = -row.eta if st == PULLING and row.eta is not None else 0.0 if st != PULLING \
        else float("inf")
    return (st, eta, row.name)


def sort_rows(rows: Iterable[PodRow], now: float) -> list[PodRow]:
    return sorted(rows, key=lambda r: row_order(r, now))


def pod_row(obj: Obj, old: PodRow | None, now: float) -> PodRow:
    """The row of a PodImagePull; ``moved_at`` kept while its bytes stand still."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    images = tuple(
        Image(clean(str(i.get("container") or "")), clean(str(i.get("image") or "")),
              clean(str(i.get("phase") or "Unknown")),
              p if isinstance(p := i.get("progress"), int) else None,
              t if isinstance(t := i.get("total"), int) else None,
              clean(str(i.get("reason") or "")))
        for i in status.get("images") or () if isinstance(i, dict))
    progress, total = status.get("progress"), status.get("total")
    row = PodRow(
        name=clean(f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"),
        node=clean(str((obj.get("spec") or {}).get("nodeName") or "")),
        phase=clean(str(status.get("phase") or "Unknown")),
        progress=progress if isinstance(progress, int) else None,
        total=total if isinstance(total, int) else None,
        rate=_num(status.get("bytesPerSecond")), eta=_num(status.get("etaSeconds")),
        images=images, moved_at=now)
    if old is not None and [(i.phase, i.progress) for i in old.images] == \
            [(i.phase, i.progress) for i in images]:
        row.moved_at = old.moved_at
    return row


@dataclass(frozen=True)
class NodeSum:
    node: str
    pulling: int
    eta: float | None
    rate: float | None


@dataclass(frozen=True)
class Summary:
    pods: int
    counts: dict[int, int]
    slowest: tuple[NodeSum, ...]


def summarize(rows: Iterable[PodRow], now: float, nodes: int = 3) -> Summary:
    """Counts by state and the slowest nodes: by their longest ETA, then lowest rate."""
    counts = dict.fromkeys((STUCK, WAITING, PULLING, DONE), 0)
    per_node: dict[str, list[PodRow]] = {}
    total = 0
    for r in rows:
        total += 1
        st = r.state(now)
        counts[st] += 1
        if st != DONE and r.node:
            per_node.setdefault(r.node, []).append(r)
    sums = []
    for node, rs in per_node.items():
        etas = [r.eta for r in rs if r.eta is not None]
        rates = [r.rate for r in rs if r.rate is not None]
        # Pods pulling one image on a node share its one pull: the node's rate is the
        # highest a pod shows, not their sum.
        sums.append(NodeSum(node, len(rs), max(etas) if etas else None,
                            max(rates) if rates else None))
    sums.sort(key=lambda s: (s.eta is None, -(s.eta or 0.0), s.rate or 0.0, s.node))
    return Summary(total, counts, tuple(sums[:nodes]))


class PullSet:
    """The state of every followed pod; the runner feeds it, views read it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.pods: dict[str, PodRow] = {}

    def apply(self, change: Change) -> None:
        now = self.clock()
        if change.type == "LIST":
            old = self.pods
            self.pods = {}
            for obj in change.items:
                row = pod_row(obj, old.get(_key(obj)), now)
                self.pods[_key(obj)] = row
        elif change.obj is not None:
            key = _key(change.obj)
            if change.type == "DELETED":
                self.pods.pop(key, None)
            else:
                self.pods[key] = pod_row(change.obj, self.pods.get(key), now)

    def rows(self) -> list[PodRow]:
        return sort_rows(self.pods.values(), self.clock())

    def summary(self) -> Summary:
        return summarize(self.pods.values(), self.clock())

    def failures(self) -> list[str]:
        return [f"{r.name}: {r.reason or r.phase}" for r in self.pods.values()
                if any(i.phase in FAILED for i in r.images)]

    def finished(self) -> bool:
        """Every followed pod's images are present, or failed for good (and there is
        a pod)."""
        return bool(self.pods) and all(r.done or r.permanent for r in self.pods.values())


def _key(obj: Obj) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class Runner:
    """Follows the target's pods through the collection until the set is finished.

    ``redraw`` is called at most every ``REDRAW_EVERY`` seconds and at least every
    second ("Stalled" appears with no event at all); ``on_change`` sees every change
    as it arrives (``-o json``)."""

    def __init__(self, conn: Connection, target: Target, namespace: str, *,
                 fail_fast: bool, redraw: Callable[[], None],
                 on_change: Callable[[Change], None] | None = None,
                 on_retry: OnRetry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.conn, self.target, self.namespace = conn, target, namespace
        self.fail_fast = fail_fast
        self.redraw, self.on_change, self.on_retry = redraw, on_change, on_retry
        self.set = PullSet(clock)
        self.changed = asyncio.Event()

    async def _watch(self) -> None:
        async for change in follow_collection(self.conn, self.target, self.namespace,
                                              on_retry=self.on_retry):
            self.set.apply(change)
            if self.on_change is not None:
                self.on_change(change)
            self.changed.set()
            if self._over():
                return

    def _over(self) -> bool:
        if self.fail_fast and self.set.failures():
            return True
        return self.set.finished()

    async def run(self) -> list[str]:
        """Follow until finished; the failures seen (empty: every image is present)."""
        watcher = asyncio.create_task(self._watch())
        try:
            while not watcher.done():
                self.changed.clear()
                waiter = asyncio.create_task(self.changed.wait())
                await asyncio.wait({waiter, watcher}, timeout=1.0,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                self.redraw()
                if not watcher.done():
                    # Let a burst of changes pile up before the next redraw.
                    await asyncio.wait({watcher}, timeout=REDRAW_EVERY)
            watcher.result()  # raise the watch's error
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        return self.set.failures()
