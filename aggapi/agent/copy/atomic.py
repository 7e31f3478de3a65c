"""Never write in place: a temp file next to the target, renamed over it at the end.

:class:`AtomicFile` does the per-file steps of an upload: 1. create
``.aggapi-tmp-<token>-<n>`` with O_CREAT|O_EXCL|O_NOFOLLOW in the (already
resolved) target directory; 2. write; 3. fsync; 4. verify size and sha256;
5. fchown to ids mapped through the container's uid_map/gid_map; 6. fchmod
(after fchown, which would clear setuid bits); 7. renameat (renameat2
RENAME_NOREPLACE when overwrite is off). :meth:`abort` unlinks the temp file, so
any failure leaves the target unchanged. All methods block: run them in workers.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from dataclasses import dataclass

from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.directio import DirectWriter
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.status import StatusError

SETID = stat.S_ISUID | stat.S_ISGID
# Start disk writeback every this many bytes: the final fsync then waits for the
# tail only, and the disk works while the network does (a 1 GiB upload otherwise
# pays its whole disk time after the last byte arrived).
WRITEBACK_STEP = 8 << 20
IOV_MAX = os.sysconf("SC_IOV_MAX")


@dataclass(frozen=True)
class Owner:
    """What the new file should look like; ids as the container sees them."""

    uid: int | None = None
    gid: int | None = None
    mode: int | None = None
    keep_setid: bool = False  # only an explicit mode= may set setuid/setgid


def existing(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def check_replaceable(dir_fd: int, name: str, path: str, overwrite: bool) -> os.stat_result | None:
    """The target's lstat, or None; refuse what a file must never replace."""
    st = existing(dir_fd, name)
    if st is None:
        return None
    if not overwrite:
        raise StatusError(409, f"{path}: already exists and overwrite=false")
    if stat.S_ISDIR(st.st_mode):
        raise StatusError(409, f"{path}: is a directory")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise StatusError(409, f"{path}: exists and is not a regular file or symlink")
    return st


class AtomicFile:
    def __init__(self, root: FsRoot, record: InflightRecord, dir_fd: int, dir_path: str,
                 name: str, *, direct: bool = False, temp: bool = True) -> None:
        self.root = root
        self.dir_fd = dir_fd
        self.name = name
        self.path = dir_path.rstrip("/") + "/" + name
        # temp=False: created under its own name, in a directory nobody sees until the
        # whole tree is published by one rename (tarextract's private tree).
        self.tmp = record.temp_name(dir_path) if temp else name
        self.fd: int | None = os.open(
            self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600, dir_fd=dir_fd)
        self.hash = hashlib.sha256()
        self.size = 0
        self.committed = False
        self._written_back: int | None = 0  # None: the file system cannot
        # Large files skip the page cache (directio); tar entries, mostly small, do not.
        self._direct = DirectWriter.start(self.fd) if direct else None

    def write(self, data: bytes) -> None:
        self.write_many([data])

    def write_many(self, pieces: list[bytes]) -> None:
        """Append ``pieces`` with writev (no joining copy), hashing them as they go."""
        assert self.fd is not None
        if self._direct is not None:
            self._direct.write_many(pieces, self.hash)
            self.size += sum(map(len, pieces))
            return
        todo = [memoryview(p) for p in pieces if p]
        while todo:
            n = os.writev(self.fd, todo[:IOV_MAX])
            while todo and n >= len(todo[0]):
                n -= len(todo.pop(0))
            if n:
                todo[0] = todo[0][n:]
        for p in pieces:
            self.hash.update(p)  # releases the GIL on large buffers
            self.size += len(p)
        done = self._written_back
        if done is not None and self.size - done >= WRITEBACK_STEP:
            ok = o2.start_writeback(self.fd, done, self.size - done)
            self._written_back = self.size if ok else None

    def finish(self, *, expect_size: int | None, expect_sha256: str | None, owner: Owner,
               replaced: os.stat_result | None, mtime_ns: int | None = None,
               sync: bool = True) -> str:
        """Steps 3-6; returns the sha256 hex. Raises (and leaves the temp) on mismatch.
        ``sync=False``: the caller makes the data durable before the rename itself (a tar's
        small files, with one syncfs for them all: tarextract)."""
        assert self.fd is not None
        if self._direct is not None:
            self._direct.finish(self.hash)
        if sync:
            os.fsync(self.fd)
        digest = self.hash.hexdigest()
        if expect_size is not None and self.size != expect_size:
            raise StatusError(400, f"{self.path}: received {self.size} bytes, expected "
                              f"{expect_size}; target unchanged")
        if expect_sha256 is not None and digest != expect_sha256.lower():
            raise sha256_mismatch(self.path, digest, expect_sha256)
        uid, gid, mode = self._attrs(owner, replaced)
        os.fchown(self.fd, uid, gid)
        os.fchmod(self.fd, mode)
        if mode & SETID and stat.S_IMODE(os.fstat(self.fd).st_mode) != mode:
            # The kernel drops setgid silently for a group the user is not in.
            raise StatusError(403, f"{self.path}: mode {mode:04o} is not permitted for "
                              f"{self.root.who()}; target unchanged")
        if mtime_ns is not None:
            os.utime(self.fd, ns=(mtime_ns, mtime_ns))
        return digest

    def _attrs(self, owner: Owner, replaced: os.stat_result | None) -> tuple[int, int, int]:
        # A replaced regular file keeps its owner and mode unless told otherwise; acting
        # as a user, it keeps only its mode (a user cannot give a file away).
        keep = replaced if replaced is not None and stat.S_ISREG(replaced.st_mode) else None
        ids = keep if keep is not None and not self.root.as_user else None
        duid, dgid = self.root.default_ids()
        uid = (self.root.uid_map.to_host(owner.uid, "uid") if owner.uid is not None
               else ids.st_uid if ids else duid)
        gid = (self.root.gid_map.to_host(owner.gid, "gid") if owner.gid is not None
               else ids.st_gid if ids else dgid)
        mode = (owner.mode if owner.mode is not None
                else stat.S_IMODE(keep.st_mode) if keep else 0o644)
        if not (owner.keep_setid and owner.mode is not None):
            mode &= ~SETID
        return uid, gid, mode & 0o7777

    def commit(self, overwrite: bool) -> None:
        """Step 7, after a last check that the container is still the same process."""
        self.root.ensure_alive()
        assert self.fd is not None
        rename(self.dir_fd, self.tmp, self.name, self.path, overwrite)
        self.committed = True
        self.close()

    def close(self) -> None:
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def abort(self) -> None:
        self.close()
        if not self.committed:
            unlink_quiet(self.dir_fd, self.tmp)


def sha256_mismatch(path: str, digest: str, expected: str) -> StatusError:
    """A file's data is not what its sender's sha256 says (also the compiled loop's,
    aggapi.agent.copy.fastuntar: the same words either way)."""
    return StatusError(400, f"{path}: sha256 mismatch: received {digest}, expected "
                       f"{expected}; target unchanged", reason="Invalid")


def rename(dir_fd: int, tmp: str, name: str, path: str, overwrite: bool) -> None:
    try:
        o2.renameat2(dir_fd, tmp, dir_fd, name, 0 if overwrite else o2.RENAME_NOREPLACE)
    except OSError as exc:
        if exc.errno == errno.EEXIST:
            raise StatusError(409, f"{path}: already exists and overwrite=false") from exc
        raise


def unlink_quiet(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def rmdir_quiet(dir_fd: int, name: str) -> None:
    """Remove a directory we created, if it is still empty; then close ``dir_fd``."""
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass  # not empty (someone else wrote there) or already gone: leave it
    finally:
        os.close(dir_fd)
