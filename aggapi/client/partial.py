"""A download's partial file beside its destination, kept for resuming.

``<dir>/.<name>.ncp-partial`` receives the bytes; ``<dir>/.<name>.ncp-partial.json``
records where they came from (source, ETag, size, sha256) so a later run can
continue with ``Range``/``If-Range``. The destination name only ever appears
through ``rename`` after fsync and sha256 verification, so it is never partial.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from aggapi.client.confine import current_umask, local_mode

CHUNK = 1 << 20
FLUSH_STEP = 8 << 20


@dataclass
class Origin:
    source: str
    etag: str
    size: int
    sha256: str


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PartialFile:
    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.data = dest.with_name(f".{dest.name}.ncp-partial")
        self.meta = dest.with_name(f".{dest.name}.ncp-partial.json")
        self.hash = hashlib.sha256()
        self.size = 0
        self._f: int | None = None
        self._flushed = self._dropped = 0  # offsets of the last two writeback steps

    def resumable(self, source: str) -> Origin | None:
        """The origin of bytes already here for ``source``, after hashing them."""
        try:
            doc = json.loads(self.meta.read_text())
            origin = Origin(**doc)
            fd = os.open(self.data, os.O_RDWR | os.O_NOFOLLOW)
        except (OSError, ValueError, TypeError):
            return None
        if origin.source != source or not origin.etag:
            os.close(fd)
            return None
        self._f = fd
        self.hash = hashlib.sha256()
        self.size = 0
        while chunk := os.read(fd, CHUNK):
            self.hash.update(chunk)
            self.size += len(chunk)
        self._flushed = self._dropped = self.size
        return origin

    def start(self, origin: Origin) -> None:
        """Begin again from zero for ``origin``."""
        self.close()
        self.data.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.data)
        self._f = os.open(self.data, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                          0o600)
        self.hash = hashlib.sha256()
        self.size = 0
        self._flushed = self._dropped = 0
        self.remember(origin)

    def remember(self, origin: Origin) -> None:
        tmp = self.meta.with_name(self.meta.name + ".tmp")
        tmp.write_text(json.dumps(asdict(origin)))
        os.replace(tmp, self.meta)

    def write(self, chunk: bytes) -> None:
        self.write_many([chunk])

    def write_many(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Append ``pieces`` (blocking), each written and then hashed while it is still
        in the CPU cache."""
        assert self._f is not None
        for piece in pieces:
            view = memoryview(piece)
            while view:
                n = os.write(self._f, view)
                view = view[n:]
            self.hash.update(piece)
            self.size += len(piece)
        if self.size - self._flushed >= FLUSH_STEP:
            # Start writeback of what arrived since the last step, and drop the step
            # before it from the page cache (written back by now: only clean pages go).
            # The fsync at the end then waits for the tail only, and a big download
            # recycles a few MiB of page cache instead of growing it by its size.
            os.posix_fadvise(self._f, self._dropped, self.size - self._dropped,
                             os.POSIX_FADV_DONTNEED)
            self._dropped, self._flushed = self._flushed, self.size

    def close(self) -> None:
        if self._f is not None:
            os.close(self._f)
            self._f = None

    def commit(self, mode: int | None = None) -> None:
        """fsync, then rename over the destination (atomic), then fsync the directory."""
        assert self._f is not None
        if mode is not None:
            os.fchmod(self._f, local_mode(mode, current_umask()))
        os.fsync(self._f)
        self.close()
        os.replace(self.data, self.dest)
        fsync_dir(self.dest.parent)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.meta)

    def discard(self) -> None:
        self.close()
        for p in (self.data, self.meta):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
