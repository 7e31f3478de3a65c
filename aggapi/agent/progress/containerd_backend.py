"""Pull progress from containerd's own view: content ingests, leases, snapshots, images.

One ``observe()`` is one poll of the node. Its containerd calls are a fixed set
(ListStatuses, Leases.List, Snapshots.List, one filtered Images.List) plus calls
that scale with pulls and images, never with subscribers: lease resources only
when the ingest or snapshot set changed, Content.Info once per new digest, and
manifest/config reads once per digest (cached).

How an image maps to what containerd shows (containerd 1.6 and later; 2.x looks the
same whether CRI pulls through the transfer service or locally: docs/architecture.md):
- its root (index or manifest) digest comes from the image record, the reference's
  digest, or, for a tag during a pull, the newest lease holding an index/manifest
  blob whose ``containerd.io/distribution.source.<host>`` label names its repository
  (aggapi.agent.progress.leases);
- each layer's phase comes from ingests and snapshots (aggapi.agent.progress.layers):
  Done if fetched by the pull, AlreadyPresent if shared with another image or
  pulled before;
- the image is Done once its record exists;
- Failed when the pull's lease vanishes without an image record. The agent cannot
  see CRI's error; the text it gives says so and names the lease and the bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from aggapi import imageref
from aggapi.agent.progress.counters import CounterBook
from aggapi.agent.progress.eta import Flow, Plan, Sharing, plan, share_rate
from aggapi.agent.progress.layers import Snapshots, layer_states, snapshots_of
from aggapi.agent.progress.leases import LeaseIndex, LeaseView
from aggapi.agent.progress.model import (
    ALREADY_PRESENT,
    DONE,
    DOWNLOADING,
    EXTRACTING,
    FAILED,
    RESOLVING,
    WAITING,
    ImageState,
    LayerState,
    NodeState,
    PullState,
    aggregate,
)
from aggapi.agent.progress.ocimanifest import (
    ManifestError,
    ManifestStore,
    Platform,
    ResolvedImage,
)
from aggapi.agent.progress.rate import Trace
from aggapi.runtime.containerd import (
    ContentInfo,
    ImageRecord,
    IngestStatus,
    Lease,
    LeaseResource,
    SnapshotInfo,
)

NODE_SLOTS = 3  # containerd's default max_concurrent_downloads
LINK_MEMORY = 60.0  # seconds of link rates kept for its capacity
PULL_INGESTS = frozenset({"layer", "manifest", "index", "config"})
BARE_LEASE_SECONDS = 30.0


class ContainerdLike(Protocol):
    """The part of aggapi.runtime.containerd.ContainerdClient the engine uses."""

    rpc_count: int

    async def list_statuses(self, filters: Sequence[str] = ()) -> list[IngestStatus]: ...
    async def content_info(self, digest: str) -> ContentInfo | None: ...
    async def read_content(self, digest: str, offset: int = 0, size: int = 0) -> bytes: ...
    async def get_image(self, name: str) -> ImageRecord | None: ...
    async def list_images(self, filters: Sequence[str] = ()) -> list[ImageRecord]: ...
    async def list_leases(self, filters: Sequence[str] = ()) -> list[Lease]: ...
    async def lease_resources(self, lease_id: str) -> list[LeaseResource]: ...
    async def list_snapshots(self, snapshotter: str = "overlayfs",
                             filters: Sequence[str] = ()) -> list[SnapshotInfo]: ...


@dataclass
class _Memory:
    """What the engine remembers about one watched image between polls."""

    first_seen: float
    present_at_start: bool
    lease: str = ""
    lease_created: float = 0.0
    tentative: bool = False  # bound to a lease that had no manifest yet
    failed: str = ""
    high: dict[str, int] = field(default_factory=dict)  # layer -> highest offset seen
    last_layers: tuple[LayerState, ...] = ()


class ContainerdBackend:
    name = "containerd"

    def __init__(self, client: ContainerdLike, platform: Platform | None = None, *,
                 snapshotter: str = "overlayfs", clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 full_refresh: float = 1.0) -> None:
        self.client = client
        self.platform = platform or Platform.host()
        self.snapshotter = snapshotter
        self.manifests = ManifestStore(client, self.platform)
        self._clock = clock
        self._mono = monotonic
        self._counters = CounterBook()  # every layer ingest on the node, by digest
        # Layers the node downloads at once: containerd's max_concurrent_downloads
        # (default 3; shared by every pull on 2.x), raised when more are seen moving.
        self._counters.slots = NODE_SLOTS
        self._rates = self._counters.snapshot(0.0)
        self._slots: dict[str, int] = {}  # lease -> most layers seen downloading at once
        self._links: deque[tuple[float, float]] = deque()  # (time, link rate) measured
        self._sharing = Sharing()  # is the link shared? (measured at completions)
        self._last_est: dict[str, float | None] = {}  # each layer's likely rate, last poll
        self._idle: set[str] = set()  # layer ingests open at offset 0, last poll
        self.leases = LeaseIndex(client, self.manifests, monotonic=monotonic,
                                 full_refresh=full_refresh)
        self._memory: dict[str, _Memory] = {}
        self._forget = False

    # -- one poll ---------------------------------------------------------------------

    def forget(self) -> None:
        """Nobody watches any more: drop what was remembered per image (an image may
        be removed and pulled again before the next watcher comes). Applied when the
        next observation starts, never under one in flight."""
        self._forget = True

    async def observe(self, watched: Iterable[str]) -> NodeState:
        if self._forget:
            self._memory.clear()
            self._forget = False
        refs = sorted(set(watched))
        wall = self._clock()
        statuses, leases, snaps = await asyncio.gather(
            self.client.list_statuses(), self.client.list_leases(),
            self.client.list_snapshots(self.snapshotter))
        # After the lease list: a record is created before its pull's lease is
        # deleted, so "lease gone and no record" below is never a race.
        records = await self._records(refs)
        ingests = {s.digest: s for s in statuses if s.digest}
        snapshots = snapshots_of(snaps)
        await self.leases.refresh(leases, statuses, snaps)
        await self.leases.classify()
        for s in statuses:
            if s.kind == "layer" and s.digest:
                # updated_at is the data file's mtime: when the last step landed.
                self._counters.observe(s.digest, wall, s.offset, s.updated_at or None,
                                       s.total, s.started_at or None)
        done = self._counters.sweep(wall, self.leases.created)
        self._rates = self._counters.snapshot(wall)
        waiting = self._unstarted(ingests)
        self._counters.queued = sorted(waiting, key=lambda d: waiting[d])
        rates = self._rates = replace(self._rates, queued=frozenset(waiting))
        for digest, at in sorted(done.items(), key=lambda x: x[1]):
            self._sharing.finished(at, self._last_est.get(digest),
                                   {k: r for k, r in self._last_est.items() if k not in done})
        live = {d for d, ing in ingests.items() if ing.kind == "layer"}
        # A layer began since: a new ingest, or one open at offset 0 that moved
        # (containerd 2.4 opens every layer's ingest at once, then each waits for a
        # download slot: the one a completion frees goes to such a layer at once).
        began = bool(live - self._last_est.keys()) or any(
            d in self._idle and _moved(rates.traces.get(d)) for d in live)
        self._sharing.update(rates.traces, started=began)
        self._idle = {d for d in live if not _moved(rates.traces.get(d))}

        images: dict[str, ImageState] = {}
        claimed: dict[str, str] = {}  # lease -> ref
        parsed: dict[str, imageref.ImageRef | None] = {}
        for ref in refs:
            try:
                parsed[ref] = imageref.parse(ref)
            except imageref.InvalidReference:
                parsed[ref] = None
        for ref in refs:
            p = parsed[ref]
            if p is None:
                images[ref] = ImageState(ref, FAILED, error=f"invalid image reference {ref!r}")
                continue
            images[ref] = await self._image(ref, p, records.get(str(p)), ingests, snapshots,
                                            wall, claimed)
        images = await self._tentative(images, parsed, ingests, snapshots, wall, claimed)
        for ref in list(self._memory):
            if ref not in images:
                del self._memory[ref]
        pulls, pull_layers = await self._pulls(images, ingests, snapshots, wall)
        # On a shared link a completion hands its share to the others: the link's rate
        # is measured across it (the survivors' faster bytes show only at their next
        # steps, up to ~8 s later at 120 kB/s; restarting the window there read 60%).
        link = rates.group(rates.traces, whole_link=self._sharing.conserve >= 0.5)
        if link:
            # The link's capacity, for judging whether a step could have come from a
            # completion: its best rate of the last minute (while downloads wait for
            # slots, what is measured is only what runs).
            self._links.append((wall, link))
        while self._links and wall - self._links[0][0] > LINK_MEMORY:
            self._links.popleft()
        self._counters.link = max((x for _, x in self._links), default=None)
        timing = self._plan(pull_layers, ingests, link, waiting)
        images = {ref: self._timed(st, timing, link) for ref, st in images.items()}
        pulls = [self._timed_pull(p, pull_layers.get(p.lease, ()), link, timing.share)
                 for p in pulls]
        return NodeState("containerd", images, tuple(pulls), time=wall, rates=self._rates,
                         link_bytes_per_second=_round(link), shares=timing.share)

    async def _records(self, refs: Sequence[str]) -> dict[str, ImageRecord]:
        names = []
        for ref in refs:
            try:
                names.append(imageref.normalize(ref))
            except imageref.InvalidReference:
                continue
        if not names:
            return {}
        # One call for every watched image; containerd ORs the filters.
        found = await self.client.list_images([f'name=="{n}"' for n in names])
        return {r.name: r for r in found}

    # -- per image --------------------------------------------------------------------

    async def _image(self, ref: str, p: imageref.ImageRef, record: ImageRecord | None,
                     ingests: Mapping[str, IngestStatus], snaps: Snapshots, wall: float,
                     claimed: dict[str, str]) -> ImageState:
        mem = self._memory.get(ref)
        if mem is None:
            mem = self._memory[ref] = _Memory(first_seen=wall, present_at_start=record is not None)
        view, root = self.leases.lease_for(p, p.digest)
        if record is not None and (view is None or not self._repull(view, root, record, mem)):
            return await self._present(ref, record, mem, snaps)
        if view is not None:
            claimed[view.lease.id] = ref
            if mem.lease != view.lease.id:
                mem.lease, mem.lease_created = view.lease.id, view.lease.created_at
                mem.failed, mem.high = "", {}
            mem.tentative = False
            return await self._pulling(ref, root, view, mem, ingests, snaps)
        if mem.lease and mem.lease not in self.leases.views:
            # The pull's lease is gone. Confirm (one call, on this transition only).
            again = await self.client.get_image(str(p))
            if again is not None:
                return await self._present(ref, again, mem, snaps)
            mem.failed = self._failure_text(ref, mem)
            mem.lease = ""
        elif mem.lease and mem.tentative:
            # Still alive, but now holds another image's manifest: not ours after all.
            mem.lease, mem.tentative = "", False
        if mem.failed:
            layers = tuple(
                LayerState(la.digest, FAILED if la.phase in (WAITING, DOWNLOADING)
                           else la.phase, la.progress, la.total) for la in mem.last_layers)
            prog, total = aggregate(layers) if layers else (None, None)
            return ImageState(ref, FAILED, layers, prog, total, error=mem.failed)
        layers = ()
        if root:
            resolved = await self._resolve(root)
            if isinstance(resolved, ResolvedImage):
                layers = self._layers(resolved, None, mem, ingests, snaps, wall)
        prog, total = aggregate(layers) if layers else (None, None)
        return ImageState(ref, WAITING, layers, prog, total, root_digest=root)

    @staticmethod
    def _repull(view: LeaseView, root: str, record: ImageRecord, mem: _Memory) -> bool:
        """Is this live pull a re-pull of an image that has a record (kubelet's
        ``imagePullPolicy: Always``, e.g. of a tag that moved)? Its lease is newer
        than the record, and it fetched another manifest than the record's, or began
        while we watched. (A finished pull's lease outlives its new record a moment:
        that lease is older than the record.)"""
        if view.lease.created_at <= record.updated_at:
            return False
        return (view.lease.id == mem.lease or root != record.target.digest
                or view.lease.created_at >= mem.first_seen)

    async def _resolve(self, root: str) -> ResolvedImage | str | None:
        try:
            return await self.manifests.resolve(root)
        except ManifestError as err:
            return str(err)

    def _failure_text(self, ref: str, mem: _Memory) -> str:
        if mem.tentative:
            return (f"pull of {ref} stopped before any manifest arrived (containerd lease "
                    f"{mem.lease} released without an image record): unknown tag, access "
                    "denied or registry unreachable; the runtime's error is in the pod's "
                    "events")
        prog, total = aggregate(mem.last_layers) if mem.last_layers else (None, None)
        got = f" after {prog} of {total} bytes" if total is not None else ""
        return (f"pull of {ref} stopped{got}: containerd lease {mem.lease} released "
                "without an image record; the runtime's error is in the pod's events")

    async def _present(self, ref: str, record: ImageRecord, mem: _Memory,
                       snaps: Snapshots) -> ImageState:
        mem.failed, mem.tentative = "", False
        # Layers created after this moment were brought by the pull we watched.
        since = (mem.lease_created if mem.lease_created
                 else (None if mem.present_at_start else mem.first_seen))
        phase = ALREADY_PRESENT if since is None else DONE
        resolved = await self._resolve(record.target.digest)
        layers: list[LayerState] = []
        if isinstance(resolved, ResolvedImage):
            for la in resolved.layers:
                created = snaps.committed.get(la.chain_id) if la.chain_id else None
                fresh = since is not None and (
                    la.digest in mem.high or (created is not None and created >= since))
                layers.append(LayerState(la.digest, DONE if fresh else ALREADY_PRESENT,
                                         la.size, la.size))
        if phase == DONE and layers and all(la.phase == ALREADY_PRESENT for la in layers):
            phase = ALREADY_PRESENT  # nothing was downloaded: every layer was here
        tl = tuple(layers)
        prog, total = aggregate(tl) if tl else (None, None)
        mem.last_layers = tl
        return ImageState(ref, phase, tl, prog, total, root_digest=record.target.digest,
                          lease=mem.lease)

    async def _pulling(self, ref: str, root: str, view: LeaseView, mem: _Memory,
                       ingests: Mapping[str, IngestStatus], snaps: Snapshots) -> ImageState:
        resolved = await self._resolve(root) if root else None
        if isinstance(resolved, str):
            # containerd will fail the same way; say so now rather than wait for it.
            return ImageState(ref, FAILED, error=resolved, root_digest=root,
                              lease=view.lease.id)
        if resolved is None:
            return ImageState(ref, RESOLVING, root_digest=root, lease=view.lease.id)
        layers = self._layers(resolved, view, mem, ingests, snaps, None)
        mem.last_layers = layers
        phases = {la.phase for la in layers}
        phase = DOWNLOADING if phases & {DOWNLOADING, WAITING} else EXTRACTING
        if phases == {ALREADY_PRESENT}:
            phase = RESOLVING  # a re-pull that finds every layer here: nothing to fetch
        prog, total = aggregate(layers)
        return ImageState(ref, phase, layers, prog, total, root_digest=root,
                          lease=view.lease.id)

    def _layers(self, resolved: ResolvedImage, view: LeaseView | None, mem: _Memory | None,
                ingests: Mapping[str, IngestStatus], snaps: Snapshots,
                since_wall: float | None) -> tuple[LayerState, ...]:
        return layer_states(resolved, view, mem.high if mem is not None else None, ingests,
                            snaps, self.leases.created, self._rates, since_wall)

    async def _tentative(self, images: dict[str, ImageState],
                         parsed: Mapping[str, imageref.ImageRef | None],
                         ingests: Mapping[str, IngestStatus], snaps: Snapshots, wall: float,
                         claimed: dict[str, str]) -> dict[str, ImageState]:
        """A pull that has not fetched a manifest yet names no image. Bind it to a
        waiting image only when that is unambiguous: one such lease, one such image."""
        bare = [v for v in self.leases.views.values()
                if v.lease.id not in claimed and not self.leases.roots(v)]
        waiting = [r for r, s in images.items() if s.phase == WAITING]
        if len(bare) != 1 or len(waiting) != 1:
            return images
        ref, view = waiting[0], bare[0]
        mem = self._memory[ref]
        if mem.lease != view.lease.id:
            mem.lease, mem.lease_created, mem.high = view.lease.id, view.lease.created_at, {}
        mem.tentative = True
        claimed[view.lease.id] = ref
        out = dict(images)
        out[ref] = ImageState(ref, RESOLVING, lease=view.lease.id)
        return out

    # -- node view --------------------------------------------------------------------

    async def _pulls(self, images: Mapping[str, ImageState], ingests: Mapping[str, IngestStatus],
                     snaps: Snapshots, wall: float,
                     ) -> tuple[list[PullState], dict[str, tuple[LayerState, ...]]]:
        """The node's pulls, and each resolved pull's layers (for the link plan)."""
        by_lease: dict[str, list[str]] = {}
        for ref, st in images.items():
            if st.lease and st.phase not in (DONE, ALREADY_PRESENT, FAILED):
                by_lease.setdefault(st.lease, []).append(ref)
        pulls: list[PullState] = []
        pull_layers: dict[str, tuple[LayerState, ...]] = {}
        for view in sorted(self.leases.views.values(), key=lambda v: v.lease.created_at):
            roots = self.leases.roots(view)
            if not self._is_pull(view, roots, wall):
                continue
            repos = self.leases.repositories(roots)
            downloading = sum(1 for ref in view.ingests if ref.startswith("layer-"))
            root = roots[0] if roots else ""
            resolved = await self._resolve(root) if root else None
            if isinstance(resolved, ResolvedImage):
                layers = self._layers(resolved, view, None, ingests, snaps, None)
                pull_layers[view.lease.id] = layers
                prog, total = aggregate(layers)
                downloading = max(downloading, sum(la.phase == DOWNLOADING and la.progress
                                                   < la.total for la in layers))
                phases = {la.phase for la in layers}
                phase = DOWNLOADING if phases & {DOWNLOADING, WAITING} else EXTRACTING
            else:
                prog, total = None, None
                phase = RESOLVING if not isinstance(resolved, str) else FAILED
            pulls.append(PullState(view.lease.id, view.lease.created_at, phase, tuple(repos),
                                   tuple(sorted(by_lease.get(view.lease.id, ()))), root,
                                   prog, total, None, downloading))
        for lease in list(self._slots):
            if lease not in self.leases.views:
                del self._slots[lease]
        return pulls, pull_layers

    @staticmethod
    def _is_pull(view: LeaseView, roots: Sequence[str], wall: float) -> bool:
        """A pull's lease holds an index or manifest, or a pull's ingests; other
        clients' leases (snapshots of a container being built, gc holds) hold neither.
        An empty lease is a pull resolving its tag, but only for a while: a pull that
        cannot resolve fails within its registry timeouts."""
        if roots or any(r.partition("-")[0] in PULL_INGESTS for r in view.ingests):
            return True
        return not view.content and not view.ingests and not view.other and (
            wall - view.lease.created_at < BARE_LEASE_SECONDS)

    # -- rates and ETAs on the node's link ----------------------------------------------

    def _plan(self, pull_layers: Mapping[str, tuple[LayerState, ...]],
              ingests: Mapping[str, IngestStatus], link: float | None,
              waiting: Mapping[str, float]) -> Plan:
        """Seconds until each layer's last byte, and each running layer's share of the
        link now: the link shared among every layer the node downloads, queued layers
        of a pull starting as its running ones finish. Twice: when a sibling finished
        within the steps a layer's rate is measured over, its bytes in flight since its
        last step come at its new share of the link, where that rate lags (l3-400k's
        6 MiB layer, just before the step at half its bytes: 19.6 s said, 15.6 s left)."""
        rates = self._rates
        est = self._last_est = rates.estimates(d for d, ing in ingests.items()
                                               if ing.kind == "layer")
        for lease, layers in pull_layers.items():
            running = sum(1 for la in layers if la.digest in ingests)
            self._slots[lease] = max(self._slots.get(lease, 0), running)
        pace = self._unstepped_pace(est, waiting, link)
        first = plan(self._flows(pull_layers, ingests, waiting, pace), link, self._slots,
                     self._sharing.conserve, self._counters.slots)
        if not first.share:
            return first
        return plan(self._flows(pull_layers, ingests, waiting, pace, first.share), link,
                    self._slots, self._sharing.conserve, self._counters.slots)

    def _unstepped_pace(self, est: Mapping[str, float | None], waiting: Mapping[str, float],
                        link: float | None) -> dict[str, float | None]:
        """``est`` with the layers that run but have not stepped paced by what the link
        leaves them: its rate less the stepped layers' rates, split evenly. (Another
        layer's rate is no guide: shares are uneven, 221 vs 123 kB/s in issue 23.)"""
        unstepped = [d for d in est if d not in waiting and self._rates.unstepped(d)]
        if not unstepped or not link:
            return dict(est)
        used = sum(r or 0.0 for d, r in est.items() if d not in waiting and d not in unstepped)
        each = max(link - used, 0.0) / len(unstepped)
        return {**est, **dict.fromkeys(unstepped, each)}

    def _flows(self, pull_layers: Mapping[str, tuple[LayerState, ...]],
               ingests: Mapping[str, IngestStatus], waiting: Mapping[str, float],
               pace: Mapping[str, float | None], share: Mapping[str, float] | None = None
               ) -> list[Flow]:
        """Every layer the node still downloads, its bytes in flight at ``pace`` (and at
        its ``share`` of the link since a sibling finished)."""
        share = share or {}
        rates = self._rates
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
        return None if digest in waiting else self._rates.rate(digest)

    def _unstarted(self, ingests: Mapping[str, IngestStatus]) -> dict[str, float]:
        """Layer ingests open at offset 0 that have not stepped and for which no
        download slot is free: containerd 2.x opens a layer's ingest, then waits for one
        of the node's slots, so such an ingest may be queued. Those beyond the free
        slots (latest opened last) are taken as queued, with when they were opened."""
        traces = self._rates.traces
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
        self._counters.slots = max(self._counters.slots, len(moving))
        idle.sort()
        free = max(self._counters.slots - len(moving), 0)
        return {d: t for t, d in idle[free:]}

    def _timed(self, st: ImageState, timing: Plan, link: float | None) -> ImageState:
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
        rate = share_rate(mine, timing.share, self._rates)
        if rate is None:
            rate = self._rates.group(mine)
        if rate is not None and link is not None:
            rate = min(rate, link)
        if st.total is None:
            last = None
        return replace(st, layers=tuple(layers), bytes_per_second=_round(rate),
                       eta_seconds=None if last is None else round(last, 1))

    def _timed_pull(self, p: PullState, layers: tuple[LayerState, ...],
                    link: float | None, share: Mapping[str, float]) -> PullState:
        if not layers:
            return p
        mine = [la.digest for la in layers if la.phase != ALREADY_PRESENT]
        rate = share_rate(mine, share, self._rates)
        if rate is None:
            rate = self._rates.group(mine)
        if rate is not None and link is not None:
            rate = min(rate, link)
        return replace(p, bytes_per_second=_round(rate))


def _moved(tr: Trace | None) -> bool:
    return tr is not None and bool(tr.points) and tr.points[-1][1] > 0


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
