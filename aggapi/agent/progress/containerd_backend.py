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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aggapi import imageref
from aggapi.agent.progress.layers import Snapshots, layer_states, snapshots_of
from aggapi.agent.progress.leases import LeaseIndex, LeaseView
from aggapi.agent.progress.linktiming import LinkTiming
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
from aggapi.linkpeers import PeerLink
from aggapi.runtime.containerd import (
    ContentInfo,
    ImageRecord,
    IngestStatus,
    Lease,
    LeaseResource,
    SnapshotInfo,
)

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
                 full_refresh: float = 1.0,
                 received: Callable[[], int | None] | None = None) -> None:
        self.client = client
        # containerd's TCP bytes received so far (blocking; aggapi.agent.progress.sockbytes)
        self._received = received
        self.platform = platform or Platform.host()
        self.snapshotter = snapshotter
        self.manifests = ManifestStore(client, self.platform)
        self._clock = clock
        self._mono = monotonic
        self.link = LinkTiming()  # every layer ingest's bytes, rates and ETAs
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

    async def present_images(self) -> tuple[str, ...] | None:
        """The node's image records by name (not CRI's bare ``sha256:<id>`` ones)."""
        records = await self.client.list_images()
        return tuple(sorted(r.name for r in records if not r.name.startswith("sha256:")))

    async def observe(self, watched: Iterable[str]) -> NodeState:
        if self._forget:
            self._memory.clear()
            self._forget = False
        refs = sorted(set(watched))
        wall = self._clock()
        statuses, leases, snaps = await asyncio.gather(
            self.client.list_statuses(), self.client.list_leases(),
            self.client.list_snapshots(self.snapshotter))
        # containerd's received bytes count only while it fetches (the link's meter keeps
        # samples only then): an idle node's polls leave its sockets unread.
        received = await self._read_received() if statuses else None
        # After the lease list: a record is created before its pull's lease is
        # deleted, so "lease gone and no record" below is never a race.
        records = await self._records(refs)
        ingests = {s.digest: s for s in statuses if s.digest}
        snapshots = snapshots_of(snaps)
        await self.leases.refresh(leases, statuses, snaps)
        await self.leases.classify()
        waiting = self.link.record(statuses, ingests, wall, self.leases.created)

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
        link = self.link.measure(wall, received)
        timing = self.link.plan(pull_layers, ingests, link, waiting, wall)
        room = self.link.room  # no rate above what the node may take of the link
        images = {ref: self.link.timed(st, timing, room) for ref, st in images.items()}
        pulls = [self.link.timed_pull(p, pull_layers.get(p.lease, ()), room, timing) for p in pulls]
        return NodeState("containerd", images, tuple(pulls), time=wall, rates=self.link.rates,
                         link_bytes_per_second=_round(link), shares=timing.share, room=room)

    def tell_peers(self, peers: PeerLink) -> None:
        """The leader's word on the other nodes' pulls on this link (kept while fresh)."""
        self.link.peers.put(peers, self._clock())

    async def _read_received(self) -> int | None:
        return None if self._received is None else await asyncio.to_thread(self._received)

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
                                         la.size, la.size, present_since=created))
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
                            snaps, self.leases.created, self.link.rates, since_wall)

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
            repos = self.leases.repositories(roots)
            if not self._is_pull(view, roots, repos, wall):
                continue
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
        self.link.forget_leases(self.leases.views)
        return pulls, pull_layers

    @staticmethod
    def _is_pull(view: LeaseView, roots: Sequence[str], repos: Sequence[str],
                 wall: float) -> bool:
        """A pull's lease holds a pull's ingests, or an index or manifest from a
        registry; other clients' leases (snapshots of a container being built, gc holds)
        hold neither. An empty lease is a pull resolving its tag, and a manifest without
        its source label one in the moment before containerd labels it, but each only
        for a while: leases left by an import (``ctr import``: no registry, 24 h expiry)
        hold manifests without a source for good, and counted as stalled pulls."""
        if any(r.partition("-")[0] in PULL_INGESTS for r in view.ingests) or repos:
            return True
        young = wall - view.lease.created_at < BARE_LEASE_SECONDS
        if roots:
            return young
        return not view.content and not view.ingests and not view.other and young


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)
