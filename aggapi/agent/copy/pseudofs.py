"""Kernel pseudo file systems (procfs, sysfs, cgroupfs, ...) and /proc magic links.

Files there are generated on read: their size is 0 or a page whatever they
hold (``/proc/<pid>/pagemap`` yields about 256 GiB), and reading some of them
has side effects or costs the kernel real work. Downloads refuse them; a
directory walk skips them. The file system type comes from ``fstatfs(2)``
(``f_type``, the first field of ``struct statfs`` on every 64-bit Linux),
which Python's stdlib lacks.

Magic links (``/proc/<pid>/exe``, ``cwd``, ``root``, ``fd/N``...) are symlinks
whose "target" the kernel makes up from the reader's view: readlink of
``/proc/self/exe`` names the agent's own binary on the host. They are reported
without a target.
"""

from __future__ import annotations

import ctypes
import errno
import os

from aggapi.agent.copy import openat2 as o2

PSEUDO_FS: dict[int, str] = {
    0x9FA0: "procfs",
    0x62656572: "sysfs",
    0x27E0EB: "cgroupfs",
    0x63677270: "cgroup2fs",
    0x64626720: "debugfs",
    0x74726163: "tracefs",
    0x73636673: "securityfs",
    0xCAFE4A11: "bpffs",
    0x62656570: "configfs",
    0x6165676C: "pstore",
    0xDE5E81E4: "efivarfs",
    0xF97CFF8C: "selinuxfs",
    0x65735543: "fusectl",
    0x42494E4D: "binfmt_misc",
}
PROC_SUPER_MAGIC = 0x9FA0

_libc = ctypes.CDLL(None, use_errno=True)
_fstatfs = _libc.fstatfs
_fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
_fstatfs.restype = ctypes.c_int


def fs_type(fd: int) -> int:
    """``f_type`` of the file system holding ``fd`` (an O_PATH fd will do)."""
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit
    if _fstatfs(fd, buf) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fstatfs: {os.strerror(err)}")
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def pseudo_fs(fd: int) -> str | None:
    """The name of the pseudo file system holding ``fd``, or None for a real one."""
    return PSEUDO_FS.get(fs_type(fd))


def is_magic_link(root_fd: int, path: str, link_fd: int) -> bool:
    """Whether the symlink ``link_fd`` (at clean container ``path``) is a /proc magic link.

    Only procfs has them. Following it in-root with RESOLVE_NO_MAGICLINKS fails
    with ELOOP exactly when the link (or one on the way) is magic; procfs has
    no symlink loops of its own. A magic link of a process the copy's user may
    not inspect fails earlier, with EACCES: also magic (procfs's plain links,
    such as self and mounts, need no such access)."""
    if fs_type(link_fd) != PROC_SUPER_MAGIC:
        return False
    try:
        fd = o2.openat2(root_fd, path, os.O_PATH, o2.IN_CONTAINER)
    except OSError as exc:
        return exc.errno in (errno.ELOOP, errno.EACCES, errno.EPERM)
    os.close(fd)
    return False
