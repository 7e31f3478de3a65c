"""Extracting an uploaded tar into a directory, one blocking entry operation at a time.

The upload path (aggapi.agent.copy.upload) parses the tar stream and calls a
:class:`TarExtractor` in a worker thread for each entry. Every entry is
resolved under the target directory with openat2(RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS) and written as a temp file; :meth:`TarExtractor.commit`
renames them all into place once the whole tar was checked, and
:meth:`TarExtractor.rollback` removes temps and the directories it made.

Per-entry costs are what a tree of small files pays for: files under
:data:`~aggapi.agent.copy.atomic.WRITEBACK_STEP` are not fsynced one by one (a
journal commit each, most of a 10,000-file upload's time) but by one syncfs per
file system they landed on, in :meth:`TarExtractor.commit` before the first
rename; the temp names keep a crash before that invisible. syncfs also waits for
whatever else is dirty on that file system (other pods' writes on a busy node): the
price of one journal commit instead of one per file. Consecutive entries of one
directory share one openat2 of it.

A target that does not exist yet is built whole in a private directory beside it
(:func:`aggapi.agent.copy.targetdir.open_target_dir`: a recorded temp name, mode
0700), its files created under
their own names (no temp name, no check for what they replace, no rename each: nothing
else is in there), and published by :meth:`TarExtractor.commit` with one syncfs and ONE
renameat2(RENAME_NOREPLACE) of the directory: the tree appears at once, complete and
durable, or not at all. A failure, or a crash (:mod:`aggapi.agent.copy.cleanup`),
removes the private tree.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from dataclasses import dataclass

from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.atomic import (
    SETID,
    WRITEBACK_STEP,
    AtomicFile,
    Owner,
    check_replaceable,
    rmdir_quiet,
    unlink_quiet,
)
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.fsroot import FsRoot, check_name, split_parent
from aggapi.agent.copy.targetdir import RDIR, remove_created_target
from aggapi.agent.copy.uploadparams import UploadParams
from aggapi.fs import syncfs
from aggapi.fs.dirfd import descend
from aggapi.status import StatusError


@functools.cache
def target_mode() -> int:
    """The mode a target directory the upload creates gets: 0755 less the agent's umask,
    as a plain mkdir gives (read from procfs: os.umask would change it for all threads)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return 0o755 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o755 & ~0o022


def close_file(af: AtomicFile) -> None:
    af.close()
    os.close(af.dir_fd)


def entry_parts(name: str) -> list[str]:
    """The components of a tar entry name, or a 400: relative, no '..', no NUL."""
    if "\0" in name:
        raise StatusError(400, f"tar entry name contains a NUL byte: {name!r}")
    if name.startswith("/"):
        raise StatusError(400, f"tar entry has an absolute name: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise StatusError(400, f"tar entry name contains '..': {name!r}")
    for p in parts:
        check_name(p)
    return parts


@dataclass
class _Pending:
    parent: str  # relative to the target ('' = the target itself)
    tmp: str
    name: str
    is_file: bool


class TarExtractor:
    """Blocking per-entry operations, relative to an open target directory fd."""

    pending_type = _Pending  # what the compiled loop records its files as (fastuntar)

    def __init__(self, root: FsRoot, record: InflightRecord, target_fd: int, target: str,
                 params: UploadParams, *, fresh: str | None = None) -> None:
        self.root = root
        # The private tree's temp name beside the target (open_target_dir made it; target_fd
        # is on it), published by commit; None: extracting into an existing directory.
        self.fresh = fresh
        self.published = False
        self.record = record
        self.target_fd = target_fd
        self.target = target.rstrip("/")
        self.params = params
        self.pending: dict[str, _Pending] = {}  # by entry path, in tar order
        self.files: dict[str, tuple[int, int]] = {}  # entry path -> (dev, ino) of its temp
        self.created: list[str] = []  # directories we made, for rollback
        # Metadata operations so far: one per entry (untar.TarSink) and one per directory
        # level an entry's missing parents take (mkdir -p): an entry 'a/b/.../z/f' in an
        # empty target costs as much as the entries that would have listed them.
        self.ops = 0
        self.max_ops: int | None = None
        self._parent: tuple[str, int] | None = None  # the last parent opened, and its fd
        self.sync_fds: dict[int, int] = {}  # st_dev -> a directory fd on it, for syncfs

    def charge(self, n: int = 1) -> None:
        """Count ``n`` metadata operations; a 413 past ``max_ops``, before doing them."""
        self.ops += n
        if self.max_ops is not None and self.ops > self.max_ops:
            raise StatusError(413, f"tar needs more than {self.max_ops} metadata operations "
                              "(its entries and the directories made for them)")

    def full(self, rel: str) -> str:
        return f"{self.target}/{rel}" if rel else self.target or "/"

    def _ids(self, uid: int | None, gid: int | None) -> tuple[int, int]:
        o = self.params.owner
        duid, dgid = self.root.default_ids()
        return (self.root.uid_map.to_host(o.uid, "uid") if o.uid is not None else duid,
                self.root.gid_map.to_host(o.gid, "gid") if o.gid is not None else dgid)

    def open_parent(self, rel: str) -> int:
        """An fd on directory ``rel`` under the target, created (mkdir -p) if missing.
        The caller closes it; the last one is kept, as a tar lists a directory's
        entries together."""
        if self._parent is not None and self._parent[0] == rel:
            return os.dup(self._parent[1])
        fd = self._open_parent(rel)
        last, self._parent = self._parent, (rel, os.dup(fd))
        if last is not None:
            os.close(last[1])
        return fd

    def _open_parent(self, rel: str) -> int:
        try:
            return o2.openat2(self.target_fd, rel or ".", RDIR, o2.UNDER_TARGET)
        except FileNotFoundError:
            pass
        except OSError as exc:
            # In a private tree a file or symlink entry is already under its name: the
            # walk below refuses it as the temp-named one would be (_mkdir).
            if self.fresh is None or exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
        comps = rel.split("/")

        def step(fd: int, i: int) -> int:
            self.charge()
            self._mkdir(fd, comps[i], "/".join(comps[:i + 1]), 0o755)
            return o2.openat2(fd, comps[i], RDIR, o2.UNDER_TARGET)

        return descend(self.target_fd, len(comps), step)

    def _mkdir(self, parent_fd: int, name: str, rel: str, mode: int) -> None:
        if rel in self.pending:
            raise StatusError(400, f"tar entry {rel!r} is both a file and a directory "
                              "(a symlink in a tar is never followed)")
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                raise StatusError(409, f"{self.full(rel)}: exists and is not a directory") \
                    from None
            return
        self.created.append(rel)
        fd = o2.openat2(parent_fd, name, RDIR | os.O_NOFOLLOW, o2.UNDER_TARGET)
        try:
            os.fchown(fd, *self._ids(None, None))
            os.fchmod(fd, mode & 0o1777)
        finally:
            os.close(fd)

    def _slot(self, rel: str) -> tuple[int, str, str]:
        """(parent fd, parent rel, name) for a new non-directory entry ``rel``."""
        parent, _, name = rel.rpartition("/")
        pfd = self.open_parent(parent)
        try:
            if self.fresh is None:  # a private tree holds only this tar's entries
                check_replaceable(pfd, name, self.full(rel), self.params.overwrite)
            old = self.pending.pop(rel, None)  # a later entry of the same name wins
            if old is not None:
                unlink_quiet(pfd, old.tmp)
                self.files.pop(rel, None)
        except BaseException:
            os.close(pfd)
            raise
        return pfd, parent, name

    def _new_name(self, parent: str) -> str | None:
        """A temp name for a new entry in ``parent``; None in a private tree (its own)."""
        return self.record.temp_name(self.full(parent)) if self.fresh is None else None

    def _taken(self, pfd: int, rel: str) -> None:
        """A new entry's name exists in a private tree: only a directory entry of this
        tar can be there, refused as in an existing target; anything else is re-raised."""
        name = rel.rpartition("/")[2]
        check_replaceable(pfd, name, self.full(rel), self.params.overwrite)

    def mkdir(self, rel: str, mode: int) -> None:
        parent, _, name = rel.rpartition("/")
        pfd = self.open_parent(parent)
        try:
            self._mkdir(pfd, name, rel, mode)
        finally:
            os.close(pfd)

    def begin_file(self, rel: str) -> AtomicFile:
        pfd, parent, name = self._slot(rel)
        try:
            af = AtomicFile(self.root, self.record, pfd, self.full(parent), name,
                            temp=self.fresh is None)
        except FileExistsError:
            try:
                if self.fresh is not None:
                    self._taken(pfd, rel)
            finally:
                os.close(pfd)
            raise
        except BaseException:
            os.close(pfd)
            raise
        self.pending[rel] = _Pending(parent, af.tmp, name, True)
        return af

    def end_file(self, af: AtomicFile, rel: str, size: int, mode: int, mtime_ns: int, *,
                 sha256: str | None = None) -> None:
        """The file's attributes and checks: its size, and its data's sha256 (the entry's
        AGGAPI.sha256 record), before it can be renamed into place by :meth:`commit`."""
        try:
            o = self.params.owner
            # Big files were written back as they came: their own fsync waits for little.
            sync = size >= WRITEBACK_STEP or not syncfs.available()
            af.finish(expect_size=size, expect_sha256=sha256, replaced=None, mtime_ns=mtime_ns,
                      owner=Owner(o.uid, o.gid, mode & ~SETID & 0o1777), sync=sync)
            assert af.fd is not None
            st = os.fstat(af.fd)
            self.files[rel] = (st.st_dev, st.st_ino)
            if not sync and st.st_dev not in self.sync_fds:
                self.sync_fds[st.st_dev] = os.dup(af.dir_fd)
        finally:
            close_file(af)

    def symlink(self, rel: str, target: str) -> None:
        if not target or "\0" in target or len(target.encode("utf-8", "surrogateescape")) > 4095:
            raise StatusError(400, f"tar entry {rel!r}: invalid symlink target")
        pfd, parent, name = self._slot(rel)
        try:
            tmp = self._new_name(parent) or name
            try:
                os.symlink(target, tmp, dir_fd=pfd)
            except FileExistsError:
                self._taken(pfd, rel)
                raise
            self.pending[rel] = _Pending(parent, tmp, name, False)
            os.chown(tmp, *self._ids(None, None), dir_fd=pfd, follow_symlinks=False)
        finally:
            os.close(pfd)

    def hardlink(self, rel: str, link: str) -> None:
        src = "/".join(entry_parts(link))
        if src not in self.files or src not in self.pending:
            raise StatusError(400, f"tar entry {rel!r}: hard link to {link!r}, which is not an "
                              "earlier regular file of this tar")
        want = self.files[src]
        sp = self.pending[src]
        sfd = self.open_parent(sp.parent)
        try:
            fd = o2.openat2(sfd, sp.tmp, os.O_PATH | os.O_NOFOLLOW, o2.UNDER_TARGET)
        finally:
            os.close(sfd)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != want or not stat.S_ISREG(st.st_mode):
                raise StatusError(409, f"tar entry {rel!r}: link source changed under us")
            pfd, parent, name = self._slot(rel)
            try:
                tmp = self._new_name(parent) or name
                try:
                    o2.link_fd(fd, pfd, tmp)
                except FileExistsError:
                    self._taken(pfd, rel)
                    raise
                self.pending[rel] = _Pending(parent, tmp, name, True)
                self.files[rel] = want
            finally:
                os.close(pfd)
        finally:
            os.close(fd)

    def commit(self) -> None:
        """Make the unsynced files durable, then rename every temp into place, in tar
        order. A failing syncfs (a writeback error) fails the copy before any rename.
        A private tree is published instead, by one rename (:meth:`_publish`)."""
        self.root.ensure_alive()
        if self.fresh is not None:
            self._publish(self.fresh)
            return
        for fd in self.sync_fds.values():
            syncfs.syncfs(fd)
        while self.pending:
            rel, p = next(iter(self.pending.items()))
            pfd = self.open_parent(p.parent)
            try:
                # Most names are new: the no-replace rename is then the only call, and
                # only a name that exists now gets the checks (and a plain rename).
                try:
                    o2.renameat2(pfd, p.tmp, pfd, p.name, o2.RENAME_NOREPLACE)
                except FileExistsError:
                    check_replaceable(pfd, p.name, self.full(rel), self.params.overwrite)
                    o2.renameat2(pfd, p.tmp, pfd, p.name)
            finally:
                os.close(pfd)
            del self.pending[rel]

    def _publish(self, tmp: str) -> None:
        """The private tree's final mode, then one syncfs per file system (its files,
        directories and names durable), then one no-replace rename to the target name."""
        os.fchmod(self.target_fd, target_mode())
        st = os.fstat(self.target_fd)
        if st.st_dev not in self.sync_fds:
            self.sync_fds[st.st_dev] = os.dup(self.target_fd)
        for fd in self.sync_fds.values():
            syncfs.syncfs(fd)
        parent, name = split_parent(self.target)
        pfd = self.root.open(parent, RDIR)
        try:
            now = os.stat(tmp, dir_fd=pfd, follow_symlinks=False)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise StatusError(409, f"{self.target}: the upload's private directory was "
                                  "moved during the upload; nothing published")
            try:
                o2.renameat2(pfd, tmp, pfd, name, o2.RENAME_NOREPLACE)
            except FileExistsError:
                raise StatusError(409, f"{self.target}: created by someone else during the "
                                  "upload; left as it is, nothing published") from None
        finally:
            os.close(pfd)
        self.published = True
        self.pending.clear()
        self.created.clear()

    def close(self) -> None:
        """Close the fds held between entries (after commit or rollback)."""
        held = list(self.sync_fds.values())
        if self._parent is not None:
            held.append(self._parent[1])
        self._parent, self.sync_fds = None, {}
        for fd in held:
            os.close(fd)

    def rollback(self) -> None:
        if self.fresh is not None:  # the private tree goes whole (never once published)
            self.pending.clear()
            self.created.clear()
            if not self.published:
                remove_created_target(self.root, self.target, self.fresh)
            return
        for p in self.pending.values():
            try:
                pfd = self.open_parent(p.parent)
            except (OSError, StatusError):
                continue
            try:
                unlink_quiet(pfd, p.tmp)
            finally:
                os.close(pfd)
        self.pending.clear()
        for rel in reversed(self.created):
            parent, _, name = rel.rpartition("/")
            try:
                pfd = o2.openat2(self.target_fd, parent or ".", RDIR, o2.UNDER_TARGET)
            except OSError:
                continue
            rmdir_quiet(pfd, name)
