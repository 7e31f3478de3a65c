"""The private temp directories of directory downloads, and those of killed runs.

A directory download is built in ``<dir>/.<name>.ncp-XXXXXXXX`` (mkdtemp's suffix) and
renamed into place. A run that is killed (SIGKILL, a crash, a lost terminal) cannot
remove its own; the next download to the same destination does, and only where safe:

- only ours: a real directory (never followed through a symlink), owned by this user,
  named exactly as mkdtemp names ours for this destination (the partial file of a file
  download, ``.<name>.ncp-partial``, is kept for resuming and never matches);
- only stale: every live run holds an flock on its temp directory for as long as it
  runs (the kernel drops it when the process dies, however it dies); a directory whose
  lock cannot be taken belongs to a live run and is left alone. A run creates and locks
  its own under a short flock of the parent directory, which the sweep holds too, so
  no sweep sees a live run's directory before it is locked.

A stale tree is removed, not reused: a directory download has no resume (a tar's
entries cannot be asked for from the middle), and its files were never verified.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# tempfile's mkdtemp: the prefix and 8 characters of its alphabet.
SUFFIX = r"[a-z0-9_]{8}"


def prefix(dest: Path) -> str:
    return f".{dest.name}.ncp-"


def claim(dest: Path) -> tuple[Path, int]:
    """A new locked temp directory beside ``dest`` and the fd holding its lock (close
    it once the directory is renamed or removed), stale ones of earlier runs removed
    first. Blocking: call it in a worker thread."""
    parent = os.open(dest.parent, DIRFLAGS)
    try:
        fcntl.flock(parent, fcntl.LOCK_EX)  # brief: a sweep and a mkdtemp
        sweep(parent, dest)
        tmp = Path(tempfile.mkdtemp(prefix=prefix(dest), dir=dest.parent))
        try:
            lock = os.open(tmp, DIRFLAGS)
        except BaseException:
            os.rmdir(tmp)
            raise
        fcntl.flock(lock, fcntl.LOCK_EX)  # free: nobody else can have it yet
        return tmp, lock
    finally:
        os.close(parent)  # and the parent's flock with it


def sweep(parent: int, dest: Path) -> list[str]:
    """Remove the stale temp directories of ``dest`` in the directory ``parent`` (its
    fd); the names removed."""
    pattern = re.compile(re.escape(prefix(dest)) + SUFFIX)
    removed = []
    for name in os.listdir(parent):
        if pattern.fullmatch(name) is None:
            continue
        try:
            fd = os.open(name, DIRFLAGS, dir_fd=parent)
        except OSError:  # a symlink, a file, gone
            continue
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live run's
            # The name must still be the directory locked: a run that just finished
            # renamed it into place, then let its lock go. Removed without following
            # any link inside.
            try:
                st = os.stat(name, dir_fd=parent, follow_symlinks=False)
            except OSError:
                continue
            held = os.fstat(fd)
            if (st.st_dev, st.st_ino) != (held.st_dev, held.st_ino):
                continue
            with contextlib.suppress(OSError):
                shutil.rmtree(name, dir_fd=parent)
                removed.append(name)
        finally:
            os.close(fd)
    return removed
