"""Follow the image pulls of many pods at once (a workload, a selector, a node).

Each pod with a node gets its own imagepullprogress stream (image granularity), at
most ``MAX_STREAMS`` at a time: further pods wait, shown as "Queued", until a stream
ends. Rows are one per (pod, container, image), sorted so that what is stuck comes
first: Failed, BackOff, Waiting and stalled pulls (no new bytes for ``STALL_SECONDS``),
then pulls in progress, then finished ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aggapi.client.connection import Connection
from aggapi.client.errors import AggapiError
from aggapi.client.progress import PRESENT_PHASES, all_present, watch_progress
from aggapi.plugins.pacing import MAX_STREAMS, STALL_SECONDS
from aggapi.plugins.sanitize import clean, clean_obj
from aggapi.plugins.targets import Target, follow_pods

# kubelet's waiting reasons for an image that cannot be pulled.
BACKOFF_REASONS = ("ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull",
                   "RegistryUnavailable")
STUCK, MOVING, FINISHED = 0, 1, 2
Obj = dict[str, Any]


@dataclass
class Row:
    pod: str  # namespace/name
    container: str
    image: str
    phase: str = "Pending"
    progress: int = 0
    total: int = -1
    rate: float | None = None
    eta: float | None = None
    error: str = ""
    moved_at: float = 0.0  # when progress last grew (clock seconds)
    backoff: str = ""  # kubelet's reason from the pod's status (the stream may not know)

    def state(self, now: float) -> str:
        """The phase as shown: BackOff from the pod's status, Stalled when bytes
        stopped while downloading."""
        if self.backoff and self.phase not in PRESENT_PHASES:
            return "BackOff"
        if self.phase == "Downloading" and now - self.moved_at >= STALL_SECONDS:
            return "Stalled"
        return self.phase

    def rank(self, now: float) -> int:
        st = self.state(now)
        if st in ("Failed", "BackOff", "Waiting", "Stalled"):
            return STUCK
        return FINISHED if st in PRESENT_PHASES else MOVING


def sort_rows(rows: list[Row], now: float) -> list[Row]:
    return sorted(rows, key=lambda r: (r.rank(now), r.pod, r.container, r.image))


@dataclass
class PodPull:
    name: str  # namespace/name
    rows: dict[tuple[str, str], Row] = field(default_factory=dict)
    done: bool = False
    failed: str = ""
    task: asyncio.Task[None] | None = None


class PullSet:
    """The state of every followed pod; the runner feeds it, views read it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.pods: dict[str, PodPull] = {}

    def rows(self) -> list[Row]:
        return sort_rows([r for p in self.pods.values() for r in p.rows.values()], self.clock())

    def _row(self, pod: PodPull, container: str, image: str) -> Row:
        row = pod.rows.get((container, image))
        if row is None:
            row = pod.rows[(container, image)] = Row(pod.name, container, image,
                                                     moved_at=self.clock())
        return row

    def pod_seen(self, name: str, obj: Obj) -> PodPull:
        """Rows from the pod object: its containers, and kubelet's BackOff reasons."""
        pod = self.pods.setdefault(name, PodPull(name))
        # Only what is shown is cleaned (names, images, kubelet's messages).
        spec = clean_obj({k: (obj.get("spec") or {}).get(k)
                          for k in ("initContainers", "containers", "nodeName")})
        status = clean_obj({k: (obj.get("status") or {}).get(k)
                            for k in ("initContainerStatuses", "containerStatuses")})
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            row = self._row(pod, str(c.get("name", "")), str(c.get("image", "")))
            if not spec.get("nodeName") and row.phase == "Pending":
                row.phase = "Unscheduled"
        for cs in [*(status.get("initContainerStatuses") or []),
                   *(status.get("containerStatuses") or [])]:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            # status.image may be normalized (docker.io/...): match by container name.
            hit = next((r for (c, _), r in pod.rows.items() if c == cs.get("name")), None)
            if hit is not None:
                hit.backoff = str(waiting.get("message") or waiting.get("reason")) \
                    if waiting.get("reason") in BACKOFF_REASONS else ""
        return pod

    def progress(self, pod: PodPull, o: Obj) -> None:
        o = clean_obj(o)
        kind = o.get("kind")
        if kind == "Progress":
            row = self._row(pod, str(o.get("container", "")), str(o.get("image", "")))
            prog = int(o.get("progress") or 0)
            if prog > row.progress or row.phase != o.get("phase"):
                row.moved_at = self.clock()
            total = o.get("total")
            row.phase, row.progress = str(o.get("phase") or ""), max(prog, 0)
            row.total = int(total) if isinstance(total, int) else -1
            row.rate, row.eta = o.get("bytesPerSecond"), o.get("etaSeconds")
            row.error = str(o.get("error") or "")
        elif kind == "Summary":
            pod.done = all_present(o)
            for img in o.get("images") or []:
                row = self._row(pod, str(img.get("container", "")), str(img.get("image", "")))
                row.phase = str(img.get("phase") or row.phase)
                if row.phase in PRESENT_PHASES and row.total >= 0:
                    row.progress = row.total
            if not pod.done:
                pod.failed = f"pull ended in phase {o.get('phase')}"
        elif kind == "Error":
            pod.failed = str(o.get("error") or "image pull failed")
            for row in pod.rows.values():
                if o.get("container") in (None, "", row.container) \
                        and row.phase not in PRESENT_PHASES:
                    row.phase, row.error = "Failed", pod.failed

    def failures(self) -> list[str]:
        out = [f"{p.name}: {p.failed}" for p in self.pods.values() if p.failed]
        now = self.clock()
        out += [f"{r.pod} {r.container}: {r.backoff}" for p in self.pods.values()
                if not p.failed for r in p.rows.values() if r.state(now) == "BackOff"]
        return out

    def finished(self) -> bool:
        """Every followed pod's pulls are done or failed (and there is a pod)."""
        return bool(self.pods) and all(p.done or p.failed for p in self.pods.values())


class Runner:
    """Follows the target's pods with bounded concurrency until the set is finished."""

    def __init__(self, conn: Connection, target: Target, namespace: str, *,
                 fail_fast: bool, redraw: Callable[[], None],
                 max_streams: int = MAX_STREAMS) -> None:
        self.conn, self.target, self.namespace = conn, target, namespace
        self.fail_fast = fail_fast
        self.redraw = redraw
        self.set = PullSet()
        self.slots = asyncio.Semaphore(max_streams)
        self.changed = asyncio.Event()

    def _touch(self) -> None:
        self.redraw()
        self.changed.set()

    async def _stream(self, pod: PodPull, ns: str, name: str) -> None:
        async with self.slots:
            for row in pod.rows.values():
                if row.phase == "Queued":
                    row.phase = "Pending"
            try:
                async for o in watch_progress(self.conn, name, namespace=ns,
                                              granularity="image"):
                    self.set.progress(pod, o)
                    self._touch()
            except AggapiError as exc:
                pod.failed = clean(str(exc))
                self._touch()

    async def _watch(self) -> None:
        async for typ, obj in follow_pods(self.conn, self.target, self.namespace):
            meta = obj.get("metadata") or {}
            ns, name = str(meta.get("namespace") or self.namespace), str(meta.get("name"))
            key = f"{ns}/{name}"
            if typ == "DELETED":
                gone = self.set.pods.pop(key, None)
                if gone is not None and gone.task is not None:
                    gone.task.cancel()
            else:
                pod = self.set.pod_seen(key, obj)
                if pod.task is None and (obj.get("spec") or {}).get("nodeName"):
                    if self.slots.locked():
                        for row in pod.rows.values():
                            row.phase = "Queued"
                    pod.task = asyncio.create_task(self._stream(pod, ns, name))
            self._touch()

    def _over(self) -> bool:
        if self.fail_fast and self.set.failures():
            return True
        return self.set.finished()

    async def run(self) -> list[str]:
        """Follow until finished; the failures seen (empty: every image is present)."""
        watcher = asyncio.create_task(self._watch())
        try:
            while not self._over():
                self.changed.clear()
                waiter = asyncio.create_task(self.changed.wait())
                # Redraw at least every second: "Stalled" appears with no event at all.
                await asyncio.wait({waiter, watcher}, timeout=1.0,
                                   return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if watcher.done():
                    watcher.result()  # raise the watch's error
                    break
                self.redraw()
        finally:
            tasks = [watcher, *(p.task for p in self.set.pods.values() if p.task)]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return self.set.failures()
