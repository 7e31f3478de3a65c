"""Reading out of a container: the requested path looked up without following it,
its stat, and a regular file or directory opened for reading.

The requested path's last component is opened with O_PATH|O_NOFOLLOW (earlier
components resolve in-root via openat2); a regular file or directory is re-opened
for reading through /proc/self/fd from that O_PATH fd, so a name swapped for a device
or FIFO is never opened. Files and directories on kernel pseudo file systems (procfs,
sysfs, cgroupfs...: see aggapi.agent.copy.pseudofs) are refused (400): their sizes are
made up. /proc magic links are reported without a target. A directory is sent as a
PAX tar by :mod:`aggapi.agent.copy.tarwalk`. Everything here blocks: run it in workers.
"""

from __future__ import annotations

import datetime as dt
import errno
import os
import stat
from dataclasses import dataclass
from typing import Any

from aggapi.agent.copy.fsroot import FsRoot, split_parent
from aggapi.agent.copy.pseudofs import is_magic_link, pseudo_fs
from aggapi.status import StatusError


def file_type(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "dir"), (stat.S_ISLNK, "symlink"),
                       (stat.S_ISCHR, "char"), (stat.S_ISBLK, "block"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "unknown"


@dataclass
class Target:
    """The requested path, held by an O_PATH fd that never followed its last component."""

    path: str
    fd: int
    st: os.stat_result
    link: str | None

    def close(self) -> None:
        os.close(self.fd)


def lookup(root: FsRoot, path: str) -> Target:
    fd = root.open(path, os.O_PATH | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        link = None
        if stat.S_ISLNK(st.st_mode) and not is_magic_link(root.root_fd, path, fd):
            link = os.readlink("", dir_fd=fd)
    except BaseException:
        os.close(fd)
        raise
    return Target(path, fd, st, link)


def stat_dict(root: FsRoot, t: Target) -> dict[str, Any]:
    """The X-Aggapi-Stat object; ids as the container sees them."""
    mtime = dt.datetime.fromtimestamp(t.st.st_mtime_ns // 1_000_000_000, dt.UTC)
    return {
        "name": split_parent(t.path)[1] or "/",
        "size": t.st.st_size,
        "mode": t.st.st_mode,
        "mtime": mtime.strftime("%Y-%m-%dT%H:%M:%S") + f".{t.st.st_mtime_ns % 10**9:09d}Z",
        "uid": root.uid_map.to_container(t.st.st_uid),
        "gid": root.gid_map.to_container(t.st.st_gid),
        "linkTarget": t.link or "",
        "type": file_type(t.st.st_mode),
    }


def reopen(fd: int, flags: int, st: os.stat_result | None = None) -> int:
    """Open the very inode behind an O_PATH fd (not whatever its name is now);
    ``st``: its fstat, if the caller has it."""
    st = st or os.fstat(fd)
    new = os.open(f"/proc/self/fd/{fd}", flags | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    nst = os.fstat(new)
    if (nst.st_dev, nst.st_ino) != (st.st_dev, st.st_ino):  # cannot happen; belt and braces
        os.close(new)
        raise OSError(errno.ESTALE, "file changed while opening")
    return new


def refuse_pseudo(t: Target) -> None:
    fs = pseudo_fs(t.fd)
    if fs is not None:
        raise StatusError(400, f"{t.path}: is on {fs}, a kernel pseudo file system whose "
                          "files have no real size; refused")


def open_regular(t: Target) -> int:
    if not stat.S_ISREG(t.st.st_mode):
        raise StatusError(400, f"{t.path}: not a regular file or directory "
                          f"({file_type(t.st.st_mode)}); refused")
    refuse_pseudo(t)
    return reopen(t.fd, os.O_RDONLY)


def open_dir(t: Target) -> int:
    """A readable fd of the requested directory, unless it is on a pseudo file system."""
    refuse_pseudo(t)
    return reopen(t.fd, os.O_RDONLY | os.O_DIRECTORY)
