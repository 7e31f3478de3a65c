"""Thin ctypes bindings for the Linux calls the copy engine needs and Python lacks.

``openat2(2)`` (syscall 437 on x86_64 and arm64, Linux >= 5.6) resolves a path
with kernel-enforced scoping (RESOLVE_IN_ROOT, RESOLVE_BENEATH, ...), so no
path is ever resolved in the host's view. ``renameat2`` gives RENAME_NOREPLACE
for ``overwrite=false`` and ``linkat(AT_EMPTY_PATH)`` links an inode we hold
an fd on, not whatever a name points to at that moment. ``sync_file_range``
starts writeback of an upload while it is still arriving, so the fsync before
the rename has little left to do. All are blocking syscalls: callers run them
in worker threads.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform

SYS_OPENAT2 = {"x86_64": 437, "aarch64": 437, "arm64": 437}

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

# Container paths: '/' and '..' stop at the container root, /proc magic links refused.
IN_CONTAINER = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS
# Tar entries under the target: no symlink at all, no escape by '..'.
UNDER_TARGET = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS

RENAME_NOREPLACE = 1
AT_EMPTY_PATH = 0x1000
AT_SYMLINK_FOLLOW = 0x400
AT_FDCWD = -100

_EAGAIN_RETRIES = 32


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_renameat2 = _libc.renameat2
_renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                       ctypes.c_uint]
_renameat2.restype = ctypes.c_int
_linkat = _libc.linkat
_linkat.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
_linkat.restype = ctypes.c_int
_sync_file_range = _libc.sync_file_range
_sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
_sync_file_range.restype = ctypes.c_int
SYNC_FILE_RANGE_WRITE = 2


def _nr() -> int:
    try:
        return SYS_OPENAT2[platform.machine()]
    except KeyError as exc:
        raise OSError(errno.ENOSYS, f"openat2 number unknown on {platform.machine()}") from exc


def _raise(what: str, path: str | bytes) -> None:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}", os.fsdecode(path))


def openat2(dirfd: int, path: str | bytes, flags: int, resolve: int, mode: int = 0) -> int:
    """openat2(2); returns a new fd (always O_CLOEXEC). Retries the EAGAIN that
    RESOLVE_IN_ROOT/BENEATH return when a concurrent rename could have raced."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise OSError(errno.EINVAL, "NUL in path", os.fsdecode(raw))
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & (os.O_CREAT | os.O_TMPFILE) else 0,
                   resolve)
    for _ in range(_EAGAIN_RETRIES):
        fd = _syscall(ctypes.c_long(_nr()), ctypes.c_int(dirfd), ctypes.c_char_p(raw),
                      ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        if ctypes.get_errno() not in (errno.EAGAIN, errno.EINTR):
            break
    _raise("openat2", raw)
    raise AssertionError("unreachable")


def renameat2(olddirfd: int, oldname: str, newdirfd: int, newname: str, flags: int = 0) -> None:
    if _renameat2(olddirfd, os.fsencode(oldname), newdirfd, os.fsencode(newname), flags) != 0:
        _raise("renameat2", newname)


def link_fd(fd: int, newdirfd: int, newname: str) -> None:
    """Give the inode behind ``fd`` (an O_PATH fd is enough) a new name.

    AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH, which a thread acting as the container's
    user (non-zero fsuid) lacks on kernels before 6.10 (ENOENT): it then links
    through its own /proc/self/fd entry, which names the same inode."""
    if _linkat(fd, b"", newdirfd, os.fsencode(newname), AT_EMPTY_PATH) == 0:
        return
    if ctypes.get_errno() not in (errno.ENOENT, errno.EPERM):
        _raise("linkat", newname)
    if _linkat(AT_FDCWD, f"/proc/self/fd/{fd}".encode(), newdirfd, os.fsencode(newname),
               AT_SYMLINK_FOLLOW) != 0:
        _raise("linkat", newname)


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Ask the kernel to start writing [offset, offset+nbytes) to disk, without
    waiting. Best effort: False where the file system does not support it."""
    return _sync_file_range(fd, offset, nbytes, SYNC_FILE_RANGE_WRITE) == 0
