"""An in-memory stand-in for ContainerdClient, scripted by tests to look like a pull
in progress (ingests, leases, snapshots, image records), with an RPC counter."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from aggapi.agent.progress.ocimanifest import chain_ids
from aggapi.runtime.containerd import (
    ContentInfo,
    Descriptor,
    ImageRecord,
    IngestStatus,
    Lease,
    LeaseResource,
    SnapshotInfo,
)
from aggapi.runtime.errors import RuntimeNotFound

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass
class FakeImage:
    name: str  # normalized, e.g. "127.0.0.1:5000/app:1"
    host: str
    repo: str
    layers: list[tuple[str, int]]  # (digest, size)
    diff_ids: list[str]
    manifest: bytes = b""
    config: bytes = b""

    @property
    def chains(self) -> list[str]:
        return chain_ids(self.diff_ids)

    @property
    def digest(self) -> str:
        return sha(self.manifest)


def make_image(name: str, layer_sizes: Sequence[int], seed: str,
               shared: Sequence[tuple[str, int, str]] = ()) -> FakeImage:
    """``shared``: (digest, size, diff_id) layers put first (a common base)."""
    host, _, rest = name.partition("/")
    repo = rest.rsplit(":", 1)[0]
    layers = [(d, s) for d, s, _ in shared]
    diffs = [x for _, _, x in shared]
    for i, size in enumerate(layer_sizes):
        layers.append((sha(f"{seed}-layer-{i}".encode()), size))
        diffs.append(sha(f"{seed}-diff-{i}".encode()))
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(config), "size": len(config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": d, "size": s} for d, s in layers],
    }).encode()
    return FakeImage(name, host, repo, layers, diffs, manifest, config)


@dataclass
class FakeContainerd:
    rpc_count: int = 0
    now: float = 1000.0
    statuses: dict[str, IngestStatus] = field(default_factory=dict)
    blobs: dict[str, tuple[bytes, ContentInfo]] = field(default_factory=dict)
    leases: dict[str, tuple[Lease, list[LeaseResource]]] = field(default_factory=dict)
    images: dict[str, ImageRecord] = field(default_factory=dict)
    snapshots: dict[str, SnapshotInfo] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)

    def _count(self, name: str) -> None:
        self.rpc_count += 1
        self.calls.append(name)

    # -- client API ----------------------------------------------------------------
    async def version(self) -> str:
        self._count("Version")
        return "fake"

    async def list_statuses(self, filters: Sequence[str] = ()) -> list[IngestStatus]:
        self._count("ListStatuses")
        return list(self.statuses.values())

    async def content_info(self, digest: str) -> ContentInfo | None:
        self._count("Info")
        hit = self.blobs.get(digest)
        return hit[1] if hit else None

    async def read_content(self, digest: str, offset: int = 0, size: int = 0) -> bytes:
        self._count("Read")
        hit = self.blobs.get(digest)
        if hit is None:
            raise RuntimeNotFound(grpc.StatusCode.NOT_FOUND, "not found", "Content.Read")
        data = hit[0][offset:]
        return data[:size] if size else data

    async def get_image(self, name: str) -> ImageRecord | None:
        self._count("Images.Get")
        return self.images.get(name)

    async def list_images(self, filters: Sequence[str] = ()) -> list[ImageRecord]:
        self._count("Images.List")
        names = {m.group(1) for f in filters for m in [re.fullmatch(r'name=="(.*)"', f)] if m}
        return [r for n, r in self.images.items() if not filters or n in names]

    async def list_leases(self, filters: Sequence[str] = ()) -> list[Lease]:
        self._count("Leases.List")
        return [le for le, _ in self.leases.values()]

    async def lease_resources(self, lease_id: str) -> list[LeaseResource]:
        self._count("Leases.ListResources")
        hit = self.leases.get(lease_id)
        return list(hit[1]) if hit else []

    async def list_snapshots(self, snapshotter: str = "overlayfs",
                             filters: Sequence[str] = ()) -> list[SnapshotInfo]:
        self._count("Snapshots.List")
        return list(self.snapshots.values())

    # -- scripting a pull ------------------------------------------------------------
    def put_blob(self, data: bytes | None, digest: str, size: int,
                 labels: dict[str, str] | None = None, lease: str = "") -> None:
        self.blobs[digest] = (data or b"", ContentInfo(digest, size, self.now, self.now,
                                                       dict(labels or {})))
        if lease:
            self.leases[lease][1].append(LeaseResource(digest, "content"))

    def start_pull(self, img: FakeImage, lease: str) -> None:
        self.leases[lease] = (Lease(lease, self.now, {}), [])

    def fetch_manifest(self, img: FakeImage, lease: str, source_label: bool = True) -> None:
        """Commit the manifest and config. ``source_label=False`` stops in the window
        where containerd has set the gc.ref labels but not yet the source label."""
        labels = {"containerd.io/gc.ref.content.config": sha(img.config)}
        if source_label:
            labels.update(self.source_label(img))
        for i, (d, _) in enumerate(img.layers):
            labels[f"containerd.io/gc.ref.content.l.{i}"] = d
        self.put_blob(img.manifest, img.digest, len(img.manifest), labels, lease)
        self.put_blob(img.config, sha(img.config), len(img.config), {}, lease)

    @staticmethod
    def source_label(img: FakeImage) -> dict[str, str]:
        return {f"containerd.io/distribution.source.{img.host.split(':')[0]}": img.repo}

    def label_source(self, img: FakeImage) -> None:
        data, info = self.blobs[img.digest]
        self.blobs[img.digest] = (data, replace(info, labels={**info.labels,
                                                              **self.source_label(img)}))

    def download(self, digest: str, offset: int, total: int, lease: str,
                 updated_at: float | None = None, started_at: float | None = None) -> None:
        """``updated_at``: when the offset was reached (containerd: the data file's
        mtime); now when not given."""
        ref = f"layer-{digest}"
        old = self.statuses.get(ref)
        start = started_at if started_at is not None else old.started_at if old else self.now
        self.statuses[ref] = IngestStatus(ref, offset, total, start,
                                          self.now if updated_at is None else updated_at, "")
        res = self.leases[lease][1]
        if LeaseResource(ref, "ingests") not in res:
            res.append(LeaseResource(ref, "ingests"))

    def commit(self, digest: str, size: int, lease: str) -> None:
        ref = f"layer-{digest}"
        self.statuses.pop(ref, None)
        self.leases[lease] = (self.leases[lease][0],
                              [r for r in self.leases[lease][1] if r.id != ref])
        self.put_blob(None, digest, size, {}, lease)

    def extract(self, chain: str, active: bool = True) -> None:
        key = f"extract-1-{chain[-6:]} {chain}"
        if active:
            self.snapshots[key] = SnapshotInfo(key, "", "active", {}, self.now, self.now)
        else:
            self.snapshots.pop(key, None)
            self.snapshots[chain] = SnapshotInfo(chain, "", "committed", {}, self.now, self.now)

    def finish(self, img: FakeImage, lease: str) -> None:
        self.images[img.name] = ImageRecord(
            img.name, Descriptor(OCI_MANIFEST, img.digest, len(img.manifest)), {},
            self.now, self.now)
        self.leases.pop(lease, None)

    def fail(self, lease: str) -> None:
        res = self.leases.pop(lease)[1]
        for r in res:
            if r.type == "ingests":
                self.statuses.pop(r.id, None)


def record_json(x: Any) -> str:
    return json.dumps(x, sort_keys=True)
