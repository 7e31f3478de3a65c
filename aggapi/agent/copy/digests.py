"""sha256 of whole files, computed before a download starts and cached.

The digest goes in a response header, so it must be known before the first
byte; a resumed download (Range) must not pay a second full read, so digests
are kept in a small LRU keyed by (dev, ino, size, mtime_ns, ctime_ns): any
change to the file changes the key. A raw upload leaves the sha256 it computed
while writing under the committed file's key (``AtomicFile.digest_key``), so copying
a file back right after uploading it does not read it twice.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

CHUNK = 1 << 20

Key = tuple[int, int, int, int, int]


def key_of(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


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

    def digest(self, fd: int) -> str:
        """Blocking: sha256 hex of the file behind ``fd`` (read with pread), never read
        past the size fstat gives now: a file that reports less than it yields (procfs
        pagemap: size 0, 256 GiB of data) cannot hold a worker."""
        st = os.fstat(fd)
        key = key_of(st)
        cached = self.get(key)
        if cached is not None:
            return cached
        h = hashlib.sha256()
        off = 0
        while off < st.st_size:
            data = os.pread(fd, min(CHUNK, st.st_size - off), off)
            if not data:
                break
            h.update(data)
            off += len(data)
        # Only cache if the file did not change while being hashed.
        if key_of(os.fstat(fd)) == key and off == st.st_size:
            self.put(key, h.hexdigest())
        return h.hexdigest()
