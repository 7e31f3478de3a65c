"""Client for containerd's own gRPC services: content, images, leases, snapshots,
version. This is where pull progress lives (in-flight content ingests), which CRI
does not expose."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf import empty_pb2

from aggapi.proto import (
    ctd_content_pb2,
    ctd_content_pb2_grpc,
    ctd_images_pb2,
    ctd_images_pb2_grpc,
    ctd_leases_pb2,
    ctd_leases_pb2_grpc,
    ctd_snapshots_pb2,
    ctd_snapshots_pb2_grpc,
    ctd_version_pb2_grpc,
)
from aggapi.runtime.channel import ChannelClient, call
from aggapi.runtime.errors import RuntimeNotFound, RuntimeUnavailable, from_rpc_error

DEFAULT_ADDRESS = "/run/containerd/containerd.sock"
NAMESPACE_HEADER = "containerd-namespace"
_SNAPSHOT_KINDS = {0: "unknown", 1: "view", 2: "active", 3: "committed"}


def _ts(ts: object) -> float:
    """google.protobuf.Timestamp -> epoch seconds (0.0 when unset)."""
    return float(getattr(ts, "seconds", 0)) + getattr(ts, "nanos", 0) / 1e9


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IngestStatus:
    """One in-flight content-store write, e.g. a layer being downloaded."""

    ref: str  # "layer-sha256:<hex>", "manifest-sha256:...", "index-...", "config-..."
    offset: int
    total: int
    started_at: float
    updated_at: float
    expected: str  # empty for pulls: use .digest

    @property
    def kind(self) -> str:
        """"layer", "manifest", "index", "config" (or whatever prefixes the ref)."""
        head, sep, _ = self.ref.partition("-")
        return head if sep else ""

    @property
    def digest(self) -> str:
        """The digest being written, parsed from the ref when ``expected`` is empty."""
        if self.expected:
            return self.expected
        _, sep, rest = self.ref.partition("-")
        return rest if sep and ":" in rest else ""


@dataclass(frozen=True)
class ContentInfo:
    digest: str
    size: int
    created_at: float
    updated_at: float
    labels: dict[str, str]


@dataclass(frozen=True)
class ImageRecord:
    name: str
    target: Descriptor
    labels: dict[str, str]
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Lease:
    id: str
    created_at: float
    labels: dict[str, str]


@dataclass(frozen=True)
class LeaseResource:
    id: str
    type: str  # "content", "ingests", "snapshots/overlayfs", ...


@dataclass(frozen=True)
class SnapshotInfo:
    name: str
    parent: str
    kind: str  # "active" | "committed" | "view"
    labels: dict[str, str]
    created_at: float
    updated_at: float


class ContainerdClient(ChannelClient):
    """Async client of one containerd namespace (``k8s.io`` is where CRI works)."""

    def __init__(self, address: str = DEFAULT_ADDRESS, namespace: str = "k8s.io", *,
                 timeout: float = 10.0) -> None:
        super().__init__(address)
        self.namespace = namespace
        self.timeout = timeout
        self.rpc_count = 0
        self._md = ((NAMESPACE_HEADER, namespace),)
        self._content = ctd_content_pb2_grpc.ContentStub(self._channel)
        self._images = ctd_images_pb2_grpc.ImagesStub(self._channel)
        self._leases = ctd_leases_pb2_grpc.LeasesStub(self._channel)
        self._snapshots = ctd_snapshots_pb2_grpc.SnapshotsStub(self._channel)
        self._version = ctd_version_pb2_grpc.VersionStub(self._channel)

    async def version(self) -> str:
        self.rpc_count += 1
        resp = await call("Version", self._version.Version, empty_pb2.Empty(),
                          deadline=self.timeout, metadata=self._md)
        return str(resp.version)

    async def list_statuses(self, filters: Sequence[str] = ()) -> list[IngestStatus]:
        self.rpc_count += 1
        resp = await call("Content.ListStatuses", self._content.ListStatuses,
                          ctd_content_pb2.ListStatusesRequest(filters=list(filters)),
                          deadline=self.timeout, metadata=self._md)
        return [
            IngestStatus(ref=s.ref, offset=s.offset, total=s.total,
                         started_at=_ts(s.started_at), updated_at=_ts(s.updated_at),
                         expected=s.expected)
            for s in resp.statuses
        ]

    async def content_info(self, digest: str) -> ContentInfo | None:
        self.rpc_count += 1
        try:
            resp = await call("Content.Info", self._content.Info,
                              ctd_content_pb2.InfoRequest(digest=digest),
                              deadline=self.timeout, metadata=self._md)
        except RuntimeNotFound:
            return None
        i = resp.info
        return ContentInfo(digest=i.digest, size=i.size, created_at=_ts(i.created_at),
                           updated_at=_ts(i.updated_at), labels=dict(i.labels))

    async def iter_content(self, digest: str, offset: int = 0,
                           size: int = 0) -> AsyncIterator[bytes]:
        """Stream a blob in the chunks containerd sends (size 0 = to the end)."""
        self.rpc_count += 1
        stream = self._content.Read(
            ctd_content_pb2.ReadContentRequest(digest=digest, offset=offset, size=size),
            metadata=self._md,
        )
        try:
            async for chunk in stream:
                yield chunk.data
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, "Content.Read") from err
        except OSError as err:
            raise RuntimeUnavailable(grpc.StatusCode.UNAVAILABLE, str(err),
                                     "Content.Read") from err
        finally:
            stream.cancel()

    async def read_content(self, digest: str, offset: int = 0, size: int = 0) -> bytes:
        """Read a (small) blob whole, e.g. a manifest or config. Raises RuntimeNotFound."""
        return b"".join([c async for c in self.iter_content(digest, offset, size)])

    @staticmethod
    def _image(img: ctd_images_pb2.Image) -> ImageRecord:
        t = img.target
        return ImageRecord(
            name=img.name,
            target=Descriptor(media_type=t.media_type, digest=t.digest, size=t.size,
                              annotations=dict(t.annotations)),
            labels=dict(img.labels),
            created_at=_ts(img.created_at),
            updated_at=_ts(img.updated_at),
        )

    async def get_image(self, name: str) -> ImageRecord | None:
        self.rpc_count += 1
        try:
            resp = await call("Images.Get", self._images.Get,
                              ctd_images_pb2.GetImageRequest(name=name),
                              deadline=self.timeout, metadata=self._md)
        except RuntimeNotFound:
            return None
        return self._image(resp.image)

    async def list_images(self, filters: Sequence[str] = ()) -> list[ImageRecord]:
        self.rpc_count += 1
        resp = await call("Images.List", self._images.List,
                          ctd_images_pb2.ListImagesRequest(filters=list(filters)),
                          deadline=self.timeout, metadata=self._md)
        return [self._image(i) for i in resp.images]

    async def delete_image(self, name: str, *, sync: bool = True) -> None:
        """Delete an image record; ``sync`` waits for containerd's garbage collection,
        so its blobs and snapshots are gone on return. For tests and the harness:
        the agent itself never deletes anything."""
        self.rpc_count += 1
        try:
            await call("Images.Delete", self._images.Delete,
                       ctd_images_pb2.DeleteImageRequest(name=name, sync=sync),
                       deadline=self.timeout, metadata=self._md)
        except RuntimeNotFound:
            pass

    async def list_leases(self, filters: Sequence[str] = ()) -> list[Lease]:
        self.rpc_count += 1
        resp = await call("Leases.List", self._leases.List,
                          ctd_leases_pb2.ListRequest(filters=list(filters)),
                          deadline=self.timeout, metadata=self._md)
        return [Lease(id=le.id, created_at=_ts(le.created_at), labels=dict(le.labels))
                for le in resp.leases]

    async def lease_resources(self, lease_id: str) -> list[LeaseResource]:
        """Resources held by a lease; [] if the lease is gone (pull finished)."""
        self.rpc_count += 1
        try:
            resp = await call("Leases.ListResources", self._leases.ListResources,
                              ctd_leases_pb2.ListResourcesRequest(id=lease_id),
                              deadline=self.timeout, metadata=self._md)
        except RuntimeNotFound:
            return []
        return [LeaseResource(id=r.id, type=r.type) for r in resp.resources]

    async def list_snapshots(self, snapshotter: str = "overlayfs",
                             filters: Sequence[str] = ()) -> list[SnapshotInfo]:
        self.rpc_count += 1
        stream = self._snapshots.List(
            ctd_snapshots_pb2.ListSnapshotsRequest(snapshotter=snapshotter,
                                                   filters=list(filters)),
            timeout=self.timeout, metadata=self._md,
        )
        out: list[SnapshotInfo] = []
        try:
            async for page in stream:
                out.extend(
                    SnapshotInfo(name=i.name, parent=i.parent,
                                 kind=_SNAPSHOT_KINDS.get(i.kind, "unknown"),
                                 labels=dict(i.labels), created_at=_ts(i.created_at),
                                 updated_at=_ts(i.updated_at))
                    for i in page.info
                )
        except grpc.aio.AioRpcError as err:
            raise from_rpc_error(err, "Snapshots.List") from err
        except OSError as err:
            raise RuntimeUnavailable(grpc.StatusCode.UNAVAILABLE, str(err),
                                     "Snapshots.List") from err
        return out
