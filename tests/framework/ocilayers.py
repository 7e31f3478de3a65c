"""Layers as gzip'd tars written to a cache directory while their digests are computed:
random, from files, busybox's (tests.framework.oci)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import random
import tarfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from tests.framework.ocitypes import BUSYBOX, MEDIA_LAYER, Blob, Layer, TarEntry


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
