"""Large raw uploads bypass the page cache: O_DIRECT writes from one aligned buffer.

A buffered write copies every byte into the page cache and later writes the pages
back, about 0.5 CPU-s/GiB of kernel time on this machine kind (issue 15). With
O_DIRECT the device reads our buffer itself. The pieces the network handed over are
copied once into a page-aligned 1 MiB mmap (O_DIRECT wants aligned memory, offsets
and lengths), hashed there while they are still in the CPU cache, and written. The
tail, shorter than a block, is written buffered once O_DIRECT is cleared. A file
system that refuses O_DIRECT (EINVAL from fcntl or from a write) gets buffered
writes of the same bytes; durability still comes from the caller's fsync.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from typing import Protocol

BLOCK = 1 << 20


class Hash(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


def _set_direct(fd: int, on: bool) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)


class DirectWriter:
    """Appends to ``fd`` through O_DIRECT, hashing what it writes. Blocking."""

    @classmethod
    def start(cls, fd: int) -> DirectWriter | None:
        """None where the file system refuses O_DIRECT: then write buffered."""
        try:
            _set_direct(fd, True)
        except OSError:
            return None
        return cls(fd)

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.direct = True
        self._buf = mmap.mmap(-1, BLOCK)
        self._view = memoryview(self._buf)
        self._fill = 0

    def write_many(self, pieces: list[bytes], hash: Hash) -> None:
        view = self._view
        for p in pieces:
            mv = memoryview(p)
            while mv:
                k = min(len(mv), BLOCK - self._fill)
                view[self._fill:self._fill + k] = mv[:k]
                self._fill += k
                mv = mv[k:]
                if self._fill == BLOCK:
                    self._flush(hash)

    def finish(self, hash: Hash) -> None:
        """Write the tail (a partial block, so buffered)."""
        if self._fill:
            self._buffered()
            self._flush(hash)

    def close(self) -> None:
        self._view.release()
        self._buf.close()

    def _buffered(self) -> None:
        if self.direct:
            _set_direct(self.fd, False)
            self.direct = False

    def _flush(self, hash: Hash) -> None:
        # Views of the mmap are released by `with` even when a write raises: a view
        # kept alive by a traceback would stop close() from unmapping the buffer.
        with self._view[:self._fill] as block:
            hash.update(block)
            done = 0
            while done < len(block):
                try:
                    with block[done:] as rest:
                        done += os.write(self.fd, rest)
                except OSError as exc:
                    # Refused by the file system, or a short write left us unaligned.
                    if exc.errno != errno.EINVAL or not self.direct:
                        raise
                    self._buffered()
        self._fill = 0
