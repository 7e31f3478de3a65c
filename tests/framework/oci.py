"""Build OCI images without docker and push them to a registry over plain HTTP.

Layers are gzip'd tars (compresslevel 1) written to files in a cache directory
while their digests are computed, so a 150 MB layer is built once per session
and never held in memory. Manifests, configs and indexes are small JSON kept in
memory. Everything here is blocking; async callers use the ``a*`` wrappers,
which run it in a thread.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import http.client
import io
import json
import os
import random
import tarfile
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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


class _HashWriter(io.RawIOBase):
    """Write-through file object that hashes and counts what passes."""

    def __init__(self, out: BinaryIO | None) -> None:
        self.out = out
        self.sha = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self.sha.update(b)
        self.count += len(b)
        if self.out is not None:
            self.out.write(b)
        return len(b)


class _RandomReader(io.RawIOBase):
    """Deterministic incompressible bytes: same (seed, size) -> same layer digest."""

    def __init__(self, seed: str, size: int) -> None:
        self.rng = random.Random(seed)
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return self.rng.randbytes(n)


def _tar_info(name: str, *, kind: str = "file", size: int = 0, mode: int = 0o644,
              target: str = "", uid: int = 0, gid: int = 0) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name.lstrip("/"))
    ti.mtime = 0  # reproducible digests
    ti.mode = mode
    ti.uid, ti.gid = uid, gid
    if kind == "dir":
        ti.type = tarfile.DIRTYPE
    elif kind == "symlink":
        ti.type, ti.linkname = tarfile.SYMTYPE, target
    else:
        ti.size = size
    return ti


class BlobCache:
    """Builds layers into ``root`` and reuses them by key (per session dir)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _build(self, key: str, fill: Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]) -> Layer:
        meta = self.root / f"{key}.json"
        if meta.exists():
            m = json.loads(meta.read_text())
            return Layer(Blob(m["digest"], m["size"], MEDIA_LAYER, path=Path(m["path"])),
                         m["diff_id"])
        tmp = self.root / f"{key}.tmp{os.getpid()}"
        with tmp.open("wb") as f:
            outer = _HashWriter(f)  # compressed stream -> blob digest
            with gzip.GzipFile(fileobj=outer, mode="wb", compresslevel=1, mtime=0) as gz:
                inner = _HashWriter(gz)  # type: ignore[arg-type]  # tar stream -> diffID
                with tarfile.open(fileobj=inner, mode="w|",
                                  format=tarfile.PAX_FORMAT) as tar:
                    for info, fobj in fill:
                        tar.addfile(info, fobj)
        digest = "sha256:" + outer.sha.hexdigest()
        path = self.root / f"{digest.replace(':', '-')}.tar.gz"
        tmp.replace(path)
        m = {"digest": digest, "size": outer.count, "path": str(path),
             "diff_id": "sha256:" + inner.sha.hexdigest()}
        meta.write_text(json.dumps(m))
        return Layer(Blob(digest, outer.count, MEDIA_LAYER, path=path), m["diff_id"])

    def random_layer(self, size: int, seed: str = "0", name: str = "data/blob") -> Layer:
        """A layer holding one file of ``size`` random bytes (gzip can't shrink it)."""

        def fill() -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
            parts = name.split("/")[:-1]
            for i in range(len(parts)):
                yield _tar_info("/".join(parts[: i + 1]), kind="dir", mode=0o755), None
            yield _tar_info(name, size=size), _RandomReader(seed, size)  # type: ignore[misc]

        key = hashlib.sha256(f"{seed}/{name}".encode()).hexdigest()[:16]
        return self._build(f"random-{size}-{key}", fill())

    def files_layer(self, entries: Sequence[TarEntry]) -> Layer:
        """A layer of explicit entries (content is hashed into the cache key)."""
        h = hashlib.sha256()
        for e in entries:
            h.update(repr((e.path, e.mode, e.kind, e.target, e.uid, e.gid, str(e.src))).encode())
            if e.data is not None:
                h.update(e.data)
            if e.src is not None:
                st = e.src.stat()
                h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())

        def fill() -> Iterator[tuple[tarfile.TarInfo, BinaryIO | None]]:
            for e in entries:
                if e.kind != "file":
                    yield _tar_info(e.path, kind=e.kind, mode=e.mode, target=e.target,
                                    uid=e.uid, gid=e.gid), None
                elif e.src is not None:
                    with e.src.open("rb") as f:
                        yield _tar_info(e.path, size=e.src.stat().st_size, mode=e.mode,
                                        uid=e.uid, gid=e.gid), f
                else:
                    data = e.data or b""
                    yield _tar_info(e.path, size=len(data), mode=e.mode, uid=e.uid,
                                    gid=e.gid), io.BytesIO(data)

        return self._build("files-" + h.hexdigest()[:32], fill())

    def busybox_layer(self) -> Layer:
        """busybox-static at /bin/busybox with /bin/sh, plus /tmp: a runnable base."""
        return self.files_layer([
            TarEntry("bin", kind="dir", mode=0o755),
            TarEntry("bin/busybox", src=BUSYBOX, mode=0o755),
            TarEntry("bin/sh", kind="symlink", target="busybox"),
            TarEntry("bin/sleep", kind="symlink", target="busybox"),
            TarEntry("tmp", kind="dir", mode=0o1777),
            TarEntry("etc", kind="dir", mode=0o755),
            TarEntry("etc/passwd", data=b"root:x:0:0:root:/root:/bin/sh\n"),
            TarEntry("etc/group", data=b"root:x:0:\n"),
        ])


def build_image(layers: Sequence[Layer], *, os_: str = "linux", arch: str = "amd64",
                entrypoint: Sequence[str] | None = None, cmd: Sequence[str] | None = None,
                env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                                      "/usr/bin:/sbin:/bin",),
                labels: Mapping[str, str] | None = None, workdir: str = "/") -> Image:
    """Config + manifest for ``layers``. ``labels`` make otherwise-equal images distinct."""
    cfg: dict[str, object] = {"Env": list(env), "WorkingDir": workdir,
                              "Labels": dict(labels or {})}
    if entrypoint is not None:
        cfg["Entrypoint"] = list(entrypoint)
    if cmd is not None:
        cfg["Cmd"] = list(cmd)
    config = Blob.of_json({
        "created": "2024-01-01T00:00:00Z",
        "architecture": arch,
        "os": os_,
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [la.diff_id for la in layers]},
        "history": [{"created": "2024-01-01T00:00:00Z", "created_by": "tests.framework.oci"}
                    for _ in layers],
    }, MEDIA_CONFIG)
    manifest = Blob.of_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config.descriptor(),
        "layers": [la.blob.descriptor() for la in layers],
    }, MEDIA_MANIFEST)
    return Image(manifest, config, tuple(layers), os_, arch)


def build_index(images: Sequence[Image]) -> Index:
    """A multi-platform image index over per-platform manifests."""
    index = Blob.of_json({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [
            img.manifest.descriptor(platform={"architecture": img.architecture, "os": img.os})
            for img in images
        ],
    }, MEDIA_INDEX)
    return Index(index, tuple(images))


def busybox_image(cache: BlobCache, cmd: Sequence[str] = ("/bin/busybox", "sleep", "3600"),
                  labels: Mapping[str, str] | None = None) -> Image:
    """Small runnable image: busybox-static as /bin/busybox (+ sh, sleep links)."""
    return build_image([cache.busybox_layer()], cmd=cmd, labels=labels)


def pause_image(cache: BlobCache) -> Image:
    """Stand-in for registry.k8s.io/pause: sleeps forever as the sandbox's PID 1."""
    return build_image([cache.busybox_layer()],
                       entrypoint=["/bin/busybox", "sleep", "2147483647"],
                       labels={"io.aggapi.test": "pause"})


def no_shell_image(cache: BlobCache) -> Image:
    """A single static binary, no /bin/sh and no tar: what `kubectl cp` can't handle.

    busybox is stored as /app; the entrypoint runs it through a /sleep symlink
    because busybox picks its applet from argv[0].
    """
    layer = cache.files_layer([
        TarEntry("app", src=BUSYBOX, mode=0o755),
        TarEntry("sleep", kind="symlink", target="app"),
        TarEntry("data", kind="dir", mode=0o777),
        TarEntry("tmp", kind="dir", mode=0o1777),
    ])
    return build_image([layer], entrypoint=["/sleep", "3600"], env=(),
                       labels={"io.aggapi.test": "no-shell"})


# --- pushing ---------------------------------------------------------------------


def _conn(registry: str) -> http.client.HTTPConnection:
    host = registry.removeprefix("http://").rstrip("/")
    return http.client.HTTPConnection(host, timeout=120, blocksize=CHUNK)


def _check(resp: http.client.HTTPResponse, ok: tuple[int, ...], what: str) -> bytes:
    body = resp.read()
    if resp.status not in ok:
        raise RuntimeError(f"{what}: HTTP {resp.status}: {body[:500]!r}")
    return body


def push_blob(registry: str, repo: str, blob: Blob) -> None:
    """Monolithic upload (POST then PUT ?digest=), streamed from the file."""
    conn = _conn(registry)
    try:
        conn.request("HEAD", f"/v2/{repo}/blobs/{blob.digest}")
        resp = conn.getresponse()
        resp.read()
        if resp.status == 200:
            return
        conn.request("POST", f"/v2/{repo}/blobs/uploads/", headers={"Content-Length": "0"})
        resp = conn.getresponse()
        _check(resp, (202,), f"start upload {blob.digest}")
        loc = urllib.parse.urlsplit(resp.headers["Location"])
        q = [*urllib.parse.parse_qsl(loc.query), ("digest", blob.digest)]
        target = f"{loc.path}?{urllib.parse.urlencode(q)}"
        with blob.open() as body:
            conn.request("PUT", target, body=body,
                         headers={"Content-Length": str(blob.size),
                                  "Content-Type": "application/octet-stream"})
            _check(conn.getresponse(), (201,), f"upload {blob.digest}")
    finally:
        conn.close()


def push_manifest(registry: str, repo: str, ref: str, blob: Blob) -> None:
    conn = _conn(registry)
    try:
        conn.request("PUT", f"/v2/{repo}/manifests/{ref}", body=blob.read(),
                     headers={"Content-Type": blob.media_type})
        _check(conn.getresponse(), (201,), f"put manifest {repo}:{ref}")
    finally:
        conn.close()


def push_image(registry: str, repo: str, image: Image, tag: str | None = None) -> str:
    """Push blobs then the manifest (by digest, and by ``tag`` if given)."""
    for blob in image.blobs():
        push_blob(registry, repo, blob)
    push_manifest(registry, repo, image.digest, image.manifest)
    if tag:
        push_manifest(registry, repo, tag, image.manifest)
    return image.digest


def push_index(registry: str, repo: str, index: Index, tag: str | None = None) -> str:
    for img in index.images:
        push_image(registry, repo, img)
    push_manifest(registry, repo, index.digest, index.index)
    if tag:
        push_manifest(registry, repo, tag, index.index)
    return index.digest


async def apush_image(registry: str, repo: str, image: Image, tag: str | None = None) -> str:
    return await asyncio.to_thread(push_image, registry, repo, image, tag)


async def apush_index(registry: str, repo: str, index: Index, tag: str | None = None) -> str:
    return await asyncio.to_thread(push_index, registry, repo, index, tag)


@dataclass
class PushedImage:
    """Where a test image lives: ``ref`` is what CRI PullImage takes."""

    ref: str  # host:port/repo:tag
    image: Image | None = None
    index: Index | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        if self.index is not None:
            return self.index.digest
        assert self.image is not None
        return self.image.digest
