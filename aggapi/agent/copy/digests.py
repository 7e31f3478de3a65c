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

Hashing is bounded and cancellable: a hash covers exactly the size the request saw
at lookup (the size it sends, in Content-Length), so a file a container process grows
after the open cannot hold a thread for more than was checked against the size limit,
and one that shrank is a 409; :meth:`DigestCache.digest` checks a cancel flag between
1 MiB chunks, so a client that leaves frees its worker thread within one chunk. Files
bigger than a chunk are hashed on threads of the lowest CPU priority
(:func:`lower_priority`), so a long hash yields the CPU to other tenants' copies.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from aggapi.status import StatusError

log = logging.getLogger(__name__)

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

    def cached(self, fd: int, size: int) -> str | None:
        """Blocking (one fstat): the cached digest of the file behind ``fd``, if any and
        if the file still has ``size`` bytes (the digest is of those)."""
        key = key_of(os.fstat(fd))
        return self.get(key) if key[2] == size else None

    def start(self, fd: int) -> Pending:
        """Blocking (one fstat): a digest of the file behind ``fd`` to be fed in order."""
        st = os.fstat(fd)
        return Pending(key_of(st), time.clock_gettime_ns(CLOCK_REALTIME_COARSE), st)

    def finish(self, fd: int, pending: Pending) -> None:
        """Blocking (one fstat): cache a whole file's digest taken while it was sent."""
        if (pending.hashed == pending.st.st_size and key_of(os.fstat(fd)) == pending.key
                and settled(pending.st, pending.now_ns)):
            self.put(pending.key, pending.hash.hexdigest())

    def digest(self, fd: int, size: int, cancel: threading.Event | None = None) -> str:
        """Blocking: sha256 hex of the first ``size`` bytes of the file behind ``fd``
        (read with pread): the size the request saw at lookup, never what the file has
        grown to since, so a hash never reads more than the size limit allowed (nor
        more than a procfs file's made-up size). A 409 if the file no longer has
        ``size`` bytes. Raises :class:`Cancelled` once ``cancel`` is set (checked
        between chunks)."""
        st = os.fstat(fd)
        key = key_of(st)
        whole = st.st_size == size  # only a whole file's digest is cached
        cached = self.get(key) if whole else None
        if cached is not None:
            return cached
        # Read after the fstat: a change from here on is stamped at least this late.
        now = time.clock_gettime_ns(CLOCK_REALTIME_COARSE)
        h = hashlib.sha256()
        off = 0
        while off < size:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            data = os.pread(fd, min(CHUNK, size - off), off)
            if not data:
                raise StatusError(409, f"the file shrank below the {size} bytes it had when "
                                  f"looked up, while being hashed; ask again")
            h.update(data)
            off += len(data)
        # Only cache if the file did not change while being hashed and cannot change
        # later without a new key.
        if whole and key_of(os.fstat(fd)) == key and settled(st, now):
            self.put(key, h.hexdigest())
        return h.hexdigest()


NICEST = 19  # the lowest CPU priority a nice value gives


def lower_priority() -> None:
    """Run the calling thread at nice 19, the lowest priority short of SCHED_IDLE (which
    a busy node could starve for good): the kernel then gives its CPU time to every
    other thread of the agent first, and among the node's processes weighs it 15 to a
    default thread's 1024. On Linux a nice value is per thread (setpriority on the
    thread's id); raising it back would need CAP_SYS_NICE, so the thread keeps it:
    only the hash pool's threads call this. Best effort: a refusal is logged."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICEST)
    except OSError as exc:
        log.warning("hash threads keep the default CPU priority: %s", exc)
