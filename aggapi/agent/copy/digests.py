"""sha256 of whole files, computed before a download starts (or while it is sent,
:class:`Pending`, for digest=trailer) and cached.

In today's form the digest goes in a response header, so it must be known before the
first byte; a resumed download (Range) must not pay a second full read, so digests
are kept in a small LRU keyed by (dev, ino, size, mtime_ns, ctime_ns).

A key only identifies a version of the file if every later change gives a new
key. Every change stamps ctime with the file system's clock (coarse: one tick,
and on some file systems a whole second), so a rewrite at the same size within
the tick of the last change keeps the key. A digest is therefore cached only
for a file whose ctime was more than :data:`SETTLE_NS` old when the hash began:
any change after that is stamped later. Uploads do not seed the cache: the
committed file's ctime is the rename's, "now", and a container process that
owns the file can rewrite it within that tick (or, by its temp name, during the
upload), so the digest of the bytes received need not be the file's.

Hashing is bounded and cancellable: HEAD hashes only files under the size
limit, and :meth:`DigestCache.digest` checks a cancel flag between 1 MiB
chunks, so a client that leaves frees its worker thread within one chunk.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

CHUNK = 1 << 20
# The coarsest timestamp granularity of a Linux file system that matters (FAT: 2 s;
# ext4 with 128-byte inodes: 1 s); finer file systems lose nothing but the caching of
# files changed in the last two seconds.
SETTLE_NS = 2_000_000_000
# The clock the kernel stamps inodes with (clock_gettime CLOCK_REALTIME_COARSE).
CLOCK_REALTIME_COARSE = getattr(time, "CLOCK_REALTIME_COARSE", 5)

Key = tuple[int, int, int, int, int]


class Cancelled(Exception):
    """The hash was abandoned (its client went away)."""


def key_of(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def settled(st: os.stat_result, now_ns: int) -> bool:
    """Whether every change to the file after ``now_ns`` must give it a new ctime."""
    return st.st_ctime_ns + SETTLE_NS < now_ns


@dataclass
class Pending:
    """A digest taken while the file is sent (digest=trailer downloads): cached at the
    end on the same terms as :meth:`DigestCache.digest`."""

    key: Key
    now_ns: int  # when hashing began: see settled()
    st: os.stat_result
    hash: Any = field(default_factory=hashlib.sha256)
    hashed: int = 0

    def update(self, data: bytes) -> None:
        self.hash.update(data)
        self.hashed += len(data)

    def digest(self) -> bytes:
        return bytes(self.hash.digest())


class DigestCache:
    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._lru: OrderedDict[Key, str] = OrderedDict()
        self._lock = threading.Lock()  # filled from worker threads

    def get(self, key: Key) -> str | None:
        with self._lock:
            val = self._lru.get(key)
            if val is not None:
                self._lru.move_to_end(key)
            return val

    def put(self, key: Key, digest: str) -> None:
        with self._lock:
            self._lru[key] = digest
            self._lru.move_to_end(key)
            while len(self._lru) > self.size:
                self._lru.popitem(last=False)

    def cached(self, fd: int) -> str | None:
        """Blocking (one fstat): the cached digest of the file behind ``fd``, if any."""
        return self.get(key_of(os.fstat(fd)))

    def start(self, fd: int) -> Pending:
        """Blocking (one fstat): a digest of the file behind ``fd`` to be fed in order."""
        st = os.fstat(fd)
        return Pending(key_of(st), time.clock_gettime_ns(CLOCK_REALTIME_COARSE), st)

    def finish(self, fd: int, pending: Pending) -> None:
        """Blocking (one fstat): cache a whole file's digest taken while it was sent."""
        if (pending.hashed == pending.st.st_size and key_of(os.fstat(fd)) == pending.key
                and settled(pending.st, pending.now_ns)):
            self.put(pending.key, pending.hash.hexdigest())

    def digest(self, fd: int, cancel: threading.Event | None = None) -> str:
        """Blocking: sha256 hex of the file behind ``fd`` (read with pread), never read
        past the size fstat gives now: a file that reports less than it yields (procfs
        pagemap: size 0, 256 GiB of data) cannot hold a worker. Raises
        :class:`Cancelled` once ``cancel`` is set (checked between chunks)."""
        st = os.fstat(fd)
        key = key_of(st)
        cached = self.get(key)
        if cached is not None:
            return cached
        # Read after the fstat: a change from here on is stamped at least this late.
        now = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
        h = hashlib.sha256()
        off = 0
        while off < st.st_size:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            data = os.pread(fd, min(CHUNK, st.st_size - off), off)
            if not data:
                break
            h.update(data)
            off += len(data)
        # Only cache if the file did not change while being hashed and cannot change
        # later without a new key.
        if key_of(os.fstat(fd)) == key and off == st.st_size and settled(st, now):
            self.put(key, h.hexdigest())
        return h.hexdigest()
