"""syncfs(2): make everything written to one file system durable in one call.

A tree of many small files written through temp names needs its data on disk
before the renames that publish it. One fsync per file costs a journal commit
each (most of the wall time of a 10,000-file copy); one syncfs per file system
the tree touched costs one. Linux only (since 5.8 it also reports writeback
errors of that file system): :func:`available` says False where it is missing,
and callers then fsync file by file as before.
"""

from __future__ import annotations

import ctypes
import errno
import os

try:
    _libc: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # no dynamic libc to ask
    _libc = None
_syncfs = getattr(_libc, "syncfs", None)
if _syncfs is not None:
    _syncfs.argtypes = [ctypes.c_int]
    _syncfs.restype = ctypes.c_int


def available() -> bool:
    return _syncfs is not None


def syncfs(fd: int) -> None:
    """Flush the file system holding ``fd`` to disk; OSError on failure (e.g. EIO)."""
    if _syncfs is None:
        raise OSError(errno.ENOSYS, "syncfs is not available here")
    if _syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs: {os.strerror(err)}")
