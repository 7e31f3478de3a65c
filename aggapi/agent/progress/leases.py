"""What containerd's pull leases hold, remembered between polls.

containerd pulls each image under a lease. Among the blobs a lease holds, the
index finds the index and manifest blobs that are pull roots and the
repositories they come from (``containerd.io/distribution.source.<host>``
labels), reading each digest's info once. Lease resources are listed again only
when the ingest or snapshot set changed, and every ``full_refresh`` seconds.
The progress engine (aggapi.agent.progress.containerd_backend) asks it which
lease pulls an image.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from aggapi import imageref
from aggapi.agent.progress.ocimanifest import ManifestStore
from aggapi.runtime.containerd import (
    ContentInfo,
    IngestStatus,
    Lease,
    LeaseResource,
    SnapshotInfo,
)

GC_REF_PREFIX = "containerd.io/gc.ref.content."
SOURCE_PREFIX = "containerd.io/distribution.source."
CREATED_MEMORY = 4096  # content digests whose creation time is remembered


class LeaseClient(Protocol):
    """The part of aggapi.runtime.containerd.ContainerdClient the index uses."""

    async def content_info(self, digest: str) -> ContentInfo | None: ...
    async def lease_resources(self, lease_id: str) -> list[LeaseResource]: ...


@dataclass
class LeaseView:
    """A lease and the content and ingests it holds, as of its last listing."""

    lease: Lease
    content: frozenset[str] = frozenset()
    ingests: frozenset[str] = frozenset()  # ingest refs
    other: frozenset[str] = frozenset()  # anything else it holds (snapshots, ...)


@dataclass
class Candidate:
    """An index or manifest blob seen in a lease (a possible pull root)."""

    kind: str  # "index" | "manifest"
    repos: dict[str, frozenset[str]]  # host -> repositories
    children: frozenset[str]


def source_repos(labels: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """host -> repositories, from containerd.io/distribution.source.<host> labels."""
    repos: dict[str, set[str]] = {}
    for k, v in labels.items():
        if k.startswith(SOURCE_PREFIX):
            repos.setdefault(k[len(SOURCE_PREFIX):], set()).update(v.split(","))
    return {h: frozenset(r) for h, r in repos.items()}


class LeaseIndex:
    """The pulls' leases, the pull roots among their blobs, and blob creation times."""

    def __init__(self, client: LeaseClient, manifests: ManifestStore, *,
                 monotonic: Callable[[], float] = time.monotonic,
                 full_refresh: float = 1.0) -> None:
        self.client = client
        self.manifests = manifests
        self._mono = monotonic
        self.full_refresh = full_refresh
        self.views: dict[str, LeaseView] = {}
        self._last_keys: tuple[frozenset[str], frozenset[str]] | None = None
        self._refreshed = float("-inf")
        self.candidates: dict[str, Candidate] = {}
        self._not_candidates: set[str] = set()
        self.created: OrderedDict[str, float] = OrderedDict()  # content digest -> created_at

    async def refresh(self, leases: Sequence[Lease], statuses: Sequence[IngestStatus],
                      snaps: Sequence[SnapshotInfo]) -> None:
        """Follow the node's leases; list the resources of new ones (all, on a change)."""
        keys = (frozenset(s.ref for s in statuses), frozenset(s.name for s in snaps))
        now = self._mono()
        # A blob fetched between two polls changes neither set: refresh everything
        # now and then, and unresolved pulls (manifests arrive fast) every poll.
        changed = keys != self._last_keys or now - self._refreshed >= self.full_refresh
        if changed:
            self._refreshed = now
        self._last_keys = keys
        alive = {le.id for le in leases}
        for lid in list(self.views):
            if lid not in alive:
                del self.views[lid]
        stale = [le for le in leases if changed or le.id not in self.views
                 or not self.roots(self.views[le.id])]
        resources = await asyncio.gather(*(self.client.lease_resources(le.id) for le in stale))
        for le, res in zip(stale, resources, strict=True):
            self.views[le.id] = LeaseView(
                le,
                content=frozenset(r.id for r in res if r.type == "content"),
                ingests=frozenset(r.id for r in res if r.type == "ingests"),
                other=frozenset(f"{r.type}/{r.id}" for r in res
                                if r.type not in ("content", "ingests")),
            )

    async def classify(self) -> None:
        """Find index/manifest blobs among the leases' content (each digest once)."""
        in_leases: set[str] = set()
        for view in self.views.values():
            in_leases |= view.content
        # Forget digests no pull holds any more: bounded memory.
        self.candidates = {d: c for d, c in self.candidates.items() if d in in_leases}
        self._not_candidates &= in_leases
        # Each digest once: unclassified ones, layers whose creation time (fetched
        # by this pull or found in the store?) is not known yet, and manifests still
        # without their distribution-source label: containerd's pull sets gc.ref
        # labels first and the source label in a later handler, so a manifest
        # classified in between must be read again to learn its repositories.
        todo = [d for d in in_leases if d not in self.created
                or (d not in self.candidates and d not in self._not_candidates)
                or (d in self.candidates and not self.candidates[d].repos)]
        infos = await asyncio.gather(*(self.client.content_info(d) for d in todo))
        for digest, info in zip(todo, infos, strict=True):
            if info is None:
                continue
            self._remember_created(digest, info.created_at)
            repos = source_repos(info.labels)
            known = self.candidates.get(digest)
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
            self.candidates[digest] = Candidate(kind, repos, frozenset(children))

    def _remember_created(self, digest: str, created: float) -> None:
        self.created[digest] = created
        self.created.move_to_end(digest)
        while len(self.created) > CREATED_MEMORY:
            self.created.popitem(last=False)

    def roots(self, view: LeaseView) -> list[str]:
        """The index/manifest blobs of a lease that no index of it names: its pulls."""
        cands = [d for d in view.content if d in self.candidates]
        children: set[str] = set()
        for d in cands:
            if self.candidates[d].kind == "index":
                children |= self.candidates[d].children
        return [d for d in cands if d not in children]

    def lease_for(self, p: imageref.ImageRef, root: str) -> tuple[LeaseView | None, str]:
        """The newest lease pulling ``p``, and the root digest it pulls."""
        best: tuple[LeaseView, str] | None = None
        for view in self.views.values():
            if root:
                hit = root in view.content or any(r.endswith(root) for r in view.ingests)
                found = root if hit else ""
            else:
                found = next((d for d in self.roots(view)
                              if p.path in self.candidates[d].repos.get(p.host, ())), "")
            if found and (best is None or view.lease.created_at > best[0].lease.created_at):
                best = (view, found)
        return (best[0], best[1]) if best else (None, root)

    def repositories(self, roots: Sequence[str]) -> list[str]:
        """``host/repository`` of every repository the given roots come from."""
        return sorted({f"{h}/{r}" for d in roots
                       for h, rs in self.candidates[d].repos.items() for r in rs})
