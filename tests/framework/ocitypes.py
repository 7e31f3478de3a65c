"""OCI content as the harness builds it: media types, blobs, layers, images, indexes, the
entries of a files layer (tests.framework.oci)."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
BUSYBOX = Path("/bin/busybox")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Blob:
    """Content-addressed blob, on disk (``path``) or in memory (``data``)."""

    digest: str
    size: int
    media_type: str
    path: Path | None = None
    data: bytes | None = None

    def open(self) -> BinaryIO:
        if self.path is not None:
            return self.path.open("rb")
        return io.BytesIO(self.data or b"")

    def read(self) -> bytes:
        with self.open() as f:
            return f.read()

    def descriptor(self, **extra: object) -> dict[str, object]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size,
                **extra}

    @staticmethod
    def of_json(obj: object, media_type: str) -> Blob:
        data = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
        return Blob("sha256:" + hashlib.sha256(data).hexdigest(), len(data), media_type,
                    data=data)


@dataclass(frozen=True)
class Layer:
    blob: Blob
    diff_id: str  # sha256 of the uncompressed tar, as containerd labels it


@dataclass(frozen=True)
class Image:
    manifest: Blob
    config: Blob
    layers: tuple[Layer, ...]
    os: str = "linux"
    architecture: str = "amd64"

    @property
    def digest(self) -> str:
        return self.manifest.digest

    @property
    def config_digest(self) -> str:
        """CRI's image id (``PullImage`` returns it as image_ref)."""
        return self.config.digest

    def blobs(self) -> list[Blob]:
        return [layer.blob for layer in self.layers] + [self.config]

    @property
    def download_size(self) -> int:
        return sum(b.size for b in self.blobs()) + self.manifest.size


@dataclass(frozen=True)
class Index:
    index: Blob
    images: tuple[Image, ...]

    @property
    def digest(self) -> str:
        return self.index.digest

    def for_platform(self, os_: str, arch: str) -> Image:
        for img in self.images:
            if (img.os, img.architecture) == (os_, arch):
                return img
        raise KeyError(f"{os_}/{arch}")


@dataclass(frozen=True)
class TarEntry:
    """One entry of a files layer: a directory, a regular file or a symlink."""

    path: str  # inside the image, without leading "/"
    data: bytes | None = None  # regular file content...
    src: Path | None = None  # ...or copied from this host file
    mode: int = 0o644
    kind: str = "file"  # "file" | "dir" | "symlink"
    target: str = ""  # symlink target
    uid: int = 0
    gid: int = 0

