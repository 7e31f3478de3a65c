"""Pull progress from containerd's own view: content ingests, leases, snapshots, images.

One ``observe()`` is one poll of the node. Its containerd calls are a fixed set
(ListStatuses, Leases.List, Snapshots.List, one filtered Images.List) plus calls
that scale with pulls and images, never with subscribers: lease resources only
when the ingest or snapshot set changed, Content.Info once per new digest, and
manifest/config reads once per digest (cached).

How an image maps to what containerd shows (containerd 1.6 and later):
- its root (index or manifest) digest comes from the image record, the reference's
  digest, or, for a tag during a pull, the newest lease holding an index/manifest
  blob whose ``containerd.io/distribution.source.<host>`` label names its repository;
- a layer is Downloading while an ingest ``layer-<digest>`` exists, Extracting while
  an active ``extract-<id> <chainID>`` snapshot exists, and present once the
  committed snapshot ``<chainID>`` exists: Done if created after the pull began,
  otherwise AlreadyPresent (shared with another image or pulled before);
- the image is Done once its record exists;
- Failed when the pull's lease vanishes without an image record. The agent cannot
  see CRI's error; the text it gives says so and names the lease and the bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from aggapi import imageref
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
    eta,
)
from aggapi.agent.progress.ocimanifest import (
    ManifestError,
    ManifestStore,
    Platform,
    ResolvedImage,
)
from aggapi.agent.progress.rate import RateBook
from aggapi.runtime.containerd import (
    ContentInfo,
    ImageRecord,
    IngestStatus,
    Lease,
    LeaseResource,
    SnapshotInfo,
)

GC_REF_PREFIX = "containerd.io/gc.ref.content."
SOURCE_PREFIX = "containerd.io/distribution.source."
EXTRACT_PREFIX = "extract-"


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
class _LeaseView:
    lease: Lease
    content: frozenset[str] = frozenset()
    ingests: frozenset[str] = frozenset()  # ingest refs


@dataclass
class _Candidate:
    """An index or manifest blob seen in a lease (a possible pull root)."""

    kind: str  # "index" | "manifest"
    repos: dict[str, frozenset[str]]  # host -> repositories
    children: frozenset[str]


def _source_repos(labels: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """host -> repositories, from containerd.io/distribution.source.<host> labels."""
    repos: dict[str, set[str]] = {}
    for k, v in labels.items():
        if k.startswith(SOURCE_PREFIX):
            repos.setdefault(k[len(SOURCE_PREFIX):], set()).update(v.split(","))
    return {h: frozenset(r) for h, r in repos.items()}


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


@dataclass
class _Snapshots:
    committed: dict[str, float]  # chainID -> created_at
    extracting: frozenset[str]  # chainIDs being unpacked


class ContainerdBackend:
    name = "containerd"

    def __init__(self, client: ContainerdLike, platform: Platform | None = None, *,
                 snapshotter: str = "overlayfs", clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 rate_window: float = 3.0, full_refresh: float = 1.0) -> None:
        self.client = client
        self.platform = platform or Platform.host()
        self.snapshotter = snapshotter
        self.manifests = ManifestStore(client, self.platform)
        self._clock = clock
        self._mono = monotonic
        self._rates = RateBook(rate_window)
        self._leases: dict[str, _LeaseView] = {}
        self._last_keys: tuple[frozenset[str], frozenset[str]] | None = None
        self.full_refresh = full_refresh
        self._refreshed = float("-inf")
        self._candidates: dict[str, _Candidate] = {}
        self._not_candidates: set[str] = set()
        self._created: OrderedDict[str, float] = OrderedDict()  # content digest -> created_at
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
        wall, mono = self._clock(), self._mono()
        statuses, leases, snaps = await asyncio.gather(
            self.client.list_statuses(), self.client.list_leases(),
            self.client.list_snapshots(self.snapshotter))
        # After the lease list: a record is created before its pull's lease is
        # deleted, so "lease gone and no record" below is never a race.
        records = await self._records(refs)
        ingests = {s.digest: s for s in statuses if s.digest}
        snapshots = self._snapshots(snaps)
        await self._refresh_leases(leases, statuses, snaps)
        await self._classify()

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
                                            wall, mono, claimed)
        images = await self._tentative(images, parsed, ingests, snapshots, wall, mono, claimed)
        for ref in list(self._memory):
            if ref not in images:
                del self._memory[ref]
        pulls = await self._pulls(images, ingests, snapshots, mono)
        self._rates.sweep()
        return NodeState("containerd", images, tuple(pulls), time=wall)

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

    @staticmethod
    def _snapshots(snaps: Sequence[SnapshotInfo]) -> _Snapshots:
        committed: dict[str, float] = {}
        extracting: set[str] = set()
        for s in snaps:
            if s.kind == "committed":
                committed[s.name] = s.created_at
            elif s.kind == "active" and s.name.startswith(EXTRACT_PREFIX):
                _, _, chain = s.name.partition(" ")
                if chain:
                    extracting.add(chain)
        return _Snapshots(committed, frozenset(extracting))

    async def _refresh_leases(self, leases: Sequence[Lease], statuses: Sequence[IngestStatus],
                              snaps: Sequence[SnapshotInfo]) -> None:
        keys = (frozenset(s.ref for s in statuses), frozenset(s.name for s in snaps))
        now = self._mono()
        # A blob fetched between two polls changes neither set: refresh everything
        # now and then, and unresolved pulls (manifests arrive fast) every poll.
        changed = keys != self._last_keys or now - self._refreshed >= self.full_refresh
        if changed:
            self._refreshed = now
        self._last_keys = keys
        alive = {le.id for le in leases}
        for lid in list(self._leases):
            if lid not in alive:
                del self._leases[lid]
        stale = [le for le in leases if changed or le.id not in self._leases
                 or not self._roots(self._leases[le.id])]
        resources = await asyncio.gather(*(self.client.lease_resources(le.id) for le in stale))
        for le, res in zip(stale, resources, strict=True):
            self._leases[le.id] = _LeaseView(
                le,
                content=frozenset(r.id for r in res if r.type == "content"),
                ingests=frozenset(r.id for r in res if r.type == "ingests"),
            )

    async def _classify(self) -> None:
        """Find index/manifest blobs among the leases' content (each digest once)."""
        in_leases: set[str] = set()
        for view in self._leases.values():
            in_leases |= view.content
        # Forget digests no pull holds any more: bounded memory.
        self._candidates = {d: c for d, c in self._candidates.items() if d in in_leases}
        self._not_candidates &= in_leases
        # Each digest once: unclassified ones, layers whose creation time (fetched
        # by this pull or found in the store?) is not known yet, and manifests still
        # without their distribution-source label: containerd's pull sets gc.ref
        # labels first and the source label in a later handler, so a manifest
        # classified in between must be read again to learn its repositories.
        todo = [d for d in in_leases if d not in self._created
                or (d not in self._candidates and d not in self._not_candidates)
                or (d in self._candidates and not self._candidates[d].repos)]
        infos = await asyncio.gather(*(self.client.content_info(d) for d in todo))
        for digest, info in zip(todo, infos, strict=True):
            if info is None:
                continue
            self._remember_created(digest, info.created_at)
            repos = _source_repos(info.labels)
            known = self._candidates.get(digest)
            if known is not None:
                known.repos = known.repos or repos
                continue
            if digest in self._not_candidates:
                continue
            if not any(k.startswith(GC_REF_PREFIX) for k in info.labels):
                # Configs and layers carry no gc.ref labels; a manifest gets them right
                # after commit, so an unlabeled digest is retried on the next refresh
                # unless a parent manifest names it.
                continue
            doc = await self.manifests.blob_json(digest)
            kind = ManifestStore.kind(doc or {})
            if not kind:
                self._not_candidates.add(digest)
                continue
            if kind == "index":
                children = {str(m.get("digest", "")) for m in (doc or {}).get("manifests") or ()}
            else:
                children = {str(x.get("digest", "")) for x in (doc or {}).get("layers") or ()}
                children.add(str(((doc or {}).get("config") or {}).get("digest", "")))
                self._not_candidates |= children & in_leases
            self._candidates[digest] = _Candidate(kind, repos, frozenset(children))

    def _remember_created(self, digest: str, created: float) -> None:
        self._created[digest] = created
        self._created.move_to_end(digest)
        while len(self._created) > 4096:
            self._created.popitem(last=False)

    # -- attribution ------------------------------------------------------------------

    def _roots(self, view: _LeaseView) -> list[str]:
        cands = [d for d in view.content if d in self._candidates]
        children: set[str] = set()
        for d in cands:
            if self._candidates[d].kind == "index":
                children |= self._candidates[d].children
        return [d for d in cands if d not in children]

    def _lease_for(self, p: imageref.ImageRef, root: str) -> tuple[_LeaseView | None, str]:
        """The newest lease pulling ``p``, and the root digest it pulls."""
        best: tuple[_LeaseView, str] | None = None
        for view in self._leases.values():
            if root:
                hit = root in view.content or any(r.endswith(root) for r in view.ingests)
                found = root if hit else ""
            else:
                found = next((d for d in self._roots(view)
                              if p.path in self._candidates[d].repos.get(p.host, ())), "")
            if found and (best is None or view.lease.created_at > best[0].lease.created_at):
                best = (view, found)
        return (best[0], best[1]) if best else (None, root)

    # -- per image --------------------------------------------------------------------

    async def _image(self, ref: str, p: imageref.ImageRef, record: ImageRecord | None,
                     ingests: Mapping[str, IngestStatus], snaps: _Snapshots, wall: float,
                     mono: float, claimed: dict[str, str]) -> ImageState:
        mem = self._memory.get(ref)
        if mem is None:
            mem = self._memory[ref] = _Memory(first_seen=wall, present_at_start=record is not None)
        if record is not None:
            return await self._present(ref, record, mem, snaps)
        root = p.digest
        view, root = self._lease_for(p, root)
        if view is not None:
            claimed[view.lease.id] = ref
            if mem.lease != view.lease.id:
                mem.lease, mem.lease_created = view.lease.id, view.lease.created_at
                mem.failed, mem.high = "", {}
            mem.tentative = False
            return await self._pulling(ref, root, view, mem, ingests, snaps, mono)
        if mem.lease and mem.lease not in self._leases:
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
            prog, total = aggregate(layers) if layers else (-1, -1)
            return ImageState(ref, FAILED, layers, prog, total, error=mem.failed)
        layers = ()
        if root:
            resolved = await self._resolve(root)
            if isinstance(resolved, ResolvedImage):
                layers = self._layers(resolved, None, mem, ingests, snaps, mono, wall)
        prog, total = aggregate(layers) if layers else (-1, -1)
        return ImageState(ref, WAITING, layers, prog, total, root_digest=root)

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
        prog, total = aggregate(mem.last_layers) if mem.last_layers else (-1, -1)
        got = f" after {prog} of {total} bytes" if total >= 0 else ""
        return (f"pull of {ref} stopped{got}: containerd lease {mem.lease} released "
                "without an image record; the runtime's error is in the pod's events")

    async def _present(self, ref: str, record: ImageRecord, mem: _Memory,
                       snaps: _Snapshots) -> ImageState:
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
        prog, total = aggregate(tl) if tl else (-1, -1)
        mem.last_layers = tl
        return ImageState(ref, phase, tl, prog, total, root_digest=record.target.digest,
                          lease=mem.lease)

    async def _pulling(self, ref: str, root: str, view: _LeaseView, mem: _Memory,
                       ingests: Mapping[str, IngestStatus], snaps: _Snapshots,
                       mono: float) -> ImageState:
        resolved = await self._resolve(root) if root else None
        if isinstance(resolved, str):
            # containerd will fail the same way; say so now rather than wait for it.
            return ImageState(ref, FAILED, error=resolved, root_digest=root,
                              lease=view.lease.id)
        if resolved is None:
            return ImageState(ref, RESOLVING, root_digest=root, lease=view.lease.id)
        layers = self._layers(resolved, view, mem, ingests, snaps, mono, None)
        mem.last_layers = layers
        phases = {la.phase for la in layers}
        phase = DOWNLOADING if phases & {DOWNLOADING, WAITING} else EXTRACTING
        prog, total = aggregate(layers)
        rate = self._rates.add(f"image:{ref}", mono, prog) if prog >= 0 else None
        return ImageState(ref, phase, layers, prog, total, rate, eta(prog, total, rate),
                          root_digest=root, lease=view.lease.id)

    def _layers(self, resolved: ResolvedImage, view: _LeaseView | None, mem: _Memory | None,
                ingests: Mapping[str, IngestStatus], snaps: _Snapshots, mono: float,
                since_wall: float | None) -> tuple[LayerState, ...]:
        since = view.lease.created_at if view is not None else since_wall
        out: list[LayerState] = []
        for la in resolved.layers:
            ing = ingests.get(la.digest)
            high = mem.high.get(la.digest, 0) if mem is not None else 0
            in_lease = view is not None and la.digest in view.content
            created = self._created.get(la.digest)
            # Fetched by this pull (rather than found in the content store).
            fresh = high > 0 or (in_lease and created is not None and view is not None
                                 and created >= view.lease.created_at)
            if ing is not None and ing.kind == "layer":
                got = min(ing.offset, la.size)
                if mem is not None:
                    mem.high[la.digest] = max(high, got)
                rate = self._rates.add(f"layer:{la.digest}", mono, got)
                out.append(LayerState(la.digest, DOWNLOADING, got, la.size, rate,
                                      eta(got, la.size, rate)))
            elif la.chain_id and la.chain_id in snaps.committed:
                done = high > 0 or (since is not None and snaps.committed[la.chain_id] >= since)
                out.append(LayerState(la.digest, DONE if done else ALREADY_PRESENT,
                                      la.size, la.size))
            elif in_lease and not fresh:
                out.append(LayerState(la.digest, ALREADY_PRESENT, la.size, la.size))
            elif fresh and la.chain_id and la.chain_id in snaps.extracting:
                # containerd prepares extract-* snapshots before the layer arrives:
                # only a downloaded layer is really being extracted.
                out.append(LayerState(la.digest, EXTRACTING, la.size, la.size))
            elif fresh:
                # Downloaded (or between ingest commit and the next lease refresh):
                # waiting for the layers below it to be unpacked.
                out.append(LayerState(la.digest, DOWNLOADING, la.size if in_lease else high,
                                      la.size))
            else:
                out.append(LayerState(la.digest, WAITING, 0, la.size))
        return tuple(out)

    async def _tentative(self, images: dict[str, ImageState],
                         parsed: Mapping[str, imageref.ImageRef | None],
                         ingests: Mapping[str, IngestStatus], snaps: _Snapshots, wall: float,
                         mono: float, claimed: dict[str, str]) -> dict[str, ImageState]:
        """A pull that has not fetched a manifest yet names no image. Bind it to a
        waiting image only when that is unambiguous: one such lease, one such image."""
        bare = [v for v in self._leases.values()
                if v.lease.id not in claimed and not self._roots(v)]
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
                     snaps: _Snapshots, mono: float) -> list[PullState]:
        by_lease: dict[str, list[str]] = {}
        for ref, st in images.items():
            if st.lease and st.phase not in (DONE, ALREADY_PRESENT, FAILED):
                by_lease.setdefault(st.lease, []).append(ref)
        pulls: list[PullState] = []
        for view in sorted(self._leases.values(), key=lambda v: v.lease.created_at):
            roots = self._roots(view)
            repos = sorted({f"{h}/{r}" for d in roots
                            for h, rs in self._candidates[d].repos.items() for r in rs})
            downloading = sum(1 for ref in view.ingests if ref.startswith("layer-"))
            root = roots[0] if roots else ""
            resolved = await self._resolve(root) if root else None
            if isinstance(resolved, ResolvedImage):
                layers = self._layers(resolved, view, None, ingests, snaps, mono, None)
                prog, total = aggregate(layers)
                downloading = max(downloading, sum(la.phase == DOWNLOADING and la.progress
                                                   < la.total for la in layers))
                phases = {la.phase for la in layers}
                phase = DOWNLOADING if phases & {DOWNLOADING, WAITING} else EXTRACTING
                rate = self._rates.add(f"pull:{view.lease.id}", mono, prog)
            else:
                prog, total, rate = -1, -1, None
                phase = RESOLVING if not isinstance(resolved, str) else FAILED
            pulls.append(PullState(view.lease.id, view.lease.created_at, phase, tuple(repos),
                                   tuple(sorted(by_lease.get(view.lease.id, ()))), root,
                                   prog, total, rate, downloading))
        return pulls
