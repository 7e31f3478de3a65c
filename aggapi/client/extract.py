"""Extract a directory's PAX tar stream without trusting any entry.

Entries land in a fresh private temp directory beside the destination, which is
renamed into place only once the stream ended with its ``AGGAPI.complete``
record. Every entry is placed by walking its parents one component at a time
with O_NOFOLLOW from the temp dir's fd, so no write ever goes through a symlink.
An entry that would not stay inside is refused on its own and reported (the copy
goes on, like tar's "member name contains '..'"), never created:

- names that are absolute, contain '..' or NUL, or cross a symlink or a file;
- symlinks whose target, resolved against the tree as it stands on disk (see
  :mod:`aggapi.client.confine`), leaves it; because a later entry can change
  what an earlier link's path runs through, every link is checked again once
  the stream ended, until none is removed;
- hard links to anything but the very regular file an earlier entry wrote;
- devices, FIFOs, unknown types, and directories over a non-directory.

Every regular file's data is checked against its entry's sha256 (the PAX record
``AGGAPI.sha256``, :mod:`aggapi.tar.entrydigest`; where the stream says digests
trail, the next entry's ``AGGAPI.previousSha256``) before the tree is placed: a
mismatch fails the whole copy, naming the file. A stream that announces the records
(every current agent's) must carry one for every regular file; one from an older agent
(no announcement) is accepted without them, and the result says so.

Files and directories get the user's umask and no setuid/setgid/sticky bits, as
tar without -p does for a non-root user. A broken or truncated stream fails the
whole copy and removes the temp dir.

The tree is made durable before the rename that publishes it by one syncfs of the
temp dir's file system (where the platform has it; else an fsync per file and
directory), not a journal commit per file. Small writes go straight to the page
cache from the loop; only big chunks take a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggapi.client.confine import current_umask, local_mode, resolve_beneath
from aggapi.client.errors import IntegrityError, LocalError, TransferError
from aggapi.client.partial import fsync_dir
from aggapi.fs import syncfs
from aggapi.fs.dirfd import descend
from aggapi.tar.entrydigest import EntryDigests
from aggapi.tar.stream import CONT, DIR, LNK, REG, SYM, TarEntry, TarError, TarReader

CHUNK = 1 << 20
INLINE_WRITE = 64 << 10  # a page-cache write this small costs less than a thread hop
DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
RECHECK_ROUNDS = 4


@dataclass
class ExtractResult:
    path: str
    entries: int = 0
    bytes: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)  # by the server
    refused: list[str] = field(default_factory=list)  # by this extractor, one line each
    verified: bool = True  # every file checked against its AGGAPI.sha256 (False: an
    # older agent's stream, without the records)


class Refused(Exception):
    """One entry is not created; the message says why."""


def entry_parts(name: str) -> list[str]:
    """The path components of a tar entry name; [] for the root ("./")."""
    if "\0" in name:
        raise Refused(f"tar entry name contains NUL: {name!r}")
    if name.startswith("/"):
        raise Refused(f"tar entry has an absolute path: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"tar entry path contains '..': {name!r}")
    return parts


class Extractor:
    """Write one tar stream into ``tmp`` (a new private directory) using fds only."""

    def __init__(self, tmp: Path, umask: int) -> None:
        self.tmp = tmp
        self.umask = umask
        self.root = os.open(tmp, DIRFLAGS)
        # Regular files this stream wrote, by path: hard links may only name these,
        # and only while the same inode is still there.
        self.files: dict[tuple[str, ...], tuple[int, int]] = {}
        self.dirs: dict[tuple[str, ...], tuple[int, int | None]] = {}  # applied last
        self.root_mode = 0o777
        self.complete = False
        self.result = ExtractResult(str(tmp))
        self.sync_each = not syncfs.available()  # else one syncfs in finish_dirs
        self.digests = EntryDigests(trailing_ok=True)  # ncp asks for digest=trailer
        self.want: str | None = None  # the current entry's sha256, if it carries one
        # Where digests trail: the last regular file written, and the sha256 it had,
        # checked against the next entry's record before anything is placed.
        self.written: tuple[str, str] | None = None
        self._last: tuple[tuple[str, ...], int] | None = None  # the last parent, its fd

    def close(self) -> None:
        self._forget()
        os.close(self.root)

    def _forget(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            os.close(last[1])

    def _parent(self, parts: list[str], entry: str) -> int:
        """Like :meth:`_dir` (the caller closes the fd), but the last directory is kept:
        a tar lists a directory's entries together."""
        key = tuple(parts)
        if self._last is not None and self._last[0] == key:
            return os.dup(self._last[1])
        fd = self._dir(parts, entry=entry)
        self._forget()
        self._last = (key, os.dup(fd))
        return fd

    def _dir(self, parts: list[str], create: bool = True, entry: str = "") -> int:
        """An fd of the directory ``parts`` below the root; never follows a symlink."""

        def step(fd: int, i: int) -> int:
            p = parts[i]
            try:
                return os.open(p, DIRFLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(p, 0o700, dir_fd=fd)
                self.dirs.setdefault(tuple(parts[:i + 1]), (0o777, None))
                return os.open(p, DIRFLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"tar entry {entry!r} crosses a symlink or file at "
                                  f"{'/'.join(parts[:i + 1])!r}") from exc
                raise

        return descend(self.root, len(parts), step)

    def _clear(self, dfd: int, parts: list[str]) -> None:
        """Make room for a later entry of the same name, as tar does; never a directory."""
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise Refused(f"tar entry {'/'.join(parts)!r} would replace a directory")
        os.unlink(name, dir_fd=dfd)
        self.files.pop(tuple(parts), None)

    async def entry(self, reader: TarReader, on_bytes: Callable[[int], None]) -> bool:
        ent = await reader.next()
        if ent is None:
            return False
        self.want = self.digests.expected(ent)  # a TarError fails the copy
        trailed = self.digests.trailed(ent)
        written, self.written = self.written, None
        if trailed is not None and written is not None and written[1] != trailed:
            raise IntegrityError.from_message(
                f"sha256 mismatch for {written[0]!r}: got {written[1]}, the server sent "
                f"{trailed}; nothing was placed")
        if ent.pax.get("AGGAPI.complete") == "true":
            self.complete = True
            with contextlib.suppress(ValueError, TypeError):
                self.result.skipped = list(json.loads(ent.pax.get("AGGAPI.skipped", "[]")))
        try:
            await self._place(ent, reader, on_bytes)
        except Refused as exc:
            self.result.refused.append(str(exc))  # the reader skips its data
        return True

    async def _place(self, ent: TarEntry, reader: TarReader,
                     on_bytes: Callable[[int], None]) -> None:
        parts = entry_parts(ent.name)
        if not parts:  # the root itself ("./"): nothing to create
            if ent.typeflag != DIR:
                raise Refused("tar root entry is not a directory")
            self.root_mode = ent.mode
            return
        pfd = self._parent(parts[:-1], ent.name)
        try:
            if ent.typeflag == DIR:
                self._mkdir(pfd, parts, ent)
            elif ent.typeflag in (REG, CONT):
                await self._write(pfd, parts, ent, reader, on_bytes)
            elif ent.typeflag == SYM:
                if resolve_beneath(self.root, parts[:-1], ent.linkname) is None:
                    raise Refused(f"symlink {ent.name!r} -> {ent.linkname!r} points outside "
                                  "the destination")
                self._clear(pfd, parts)
                os.symlink(ent.linkname, parts[-1], dir_fd=pfd)
            elif ent.typeflag == LNK:
                self._hardlink(pfd, parts, ent)
            else:
                raise Refused(f"tar entry {ent.name!r} has a refused type {ent.typeflag!r}")
        finally:
            os.close(pfd)
        self.result.entries += 1

    def _mkdir(self, pfd: int, parts: list[str], ent: TarEntry) -> None:
        try:
            os.mkdir(parts[-1], 0o700, dir_fd=pfd)
        except FileExistsError:
            try:
                os.close(os.open(parts[-1], DIRFLAGS, dir_fd=pfd))  # must be a real dir
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"tar directory {ent.name!r} collides with a "
                                  "non-directory") from exc
                raise
        self.dirs[tuple(parts)] = (ent.mode, ent.mtime_ns)

    async def _write(self, pfd: int, parts: list[str], ent: TarEntry, reader: TarReader,
                     on_bytes: Callable[[int], None]) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        try:  # a new name (the usual case) costs no lstat first
            fd = os.open(parts[-1], flags, 0o600, dir_fd=pfd)
        except FileExistsError:
            self._clear(pfd, parts)
            fd = os.open(parts[-1], flags, 0o600, dir_fd=pfd)
        want, h = self.want, hashlib.sha256()
        try:
            while chunk := await reader.read(CHUNK):
                if len(chunk) <= INLINE_WRITE:
                    _write_all(fd, chunk)
                    h.update(chunk)
                else:
                    await asyncio.to_thread(_write_and_hash, fd, chunk, h)
                self.result.bytes += len(chunk)
                on_bytes(len(chunk))
            if want is not None and h.hexdigest() != want:
                raise IntegrityError.from_message(
                    f"sha256 mismatch for {ent.name!r}: got {h.hexdigest()}, the server "
                    f"sent {want}; nothing was placed")
            if self.digests.trailing:  # its digest comes with the next entry
                self.written = (ent.name, h.hexdigest())
            os.fchmod(fd, local_mode(ent.mode, self.umask))
            if self.sync_each:
                await asyncio.to_thread(os.fsync, fd)
            os.utime(fd, ns=(ent.mtime_ns, ent.mtime_ns))
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self.files[tuple(parts)] = (st.st_dev, st.st_ino)

    def _hardlink(self, pfd: int, parts: list[str], ent: TarEntry) -> None:
        target = entry_parts(ent.linkname)
        known = self.files.get(tuple(target))
        if known is None or target == parts:
            raise Refused(f"hard link {ent.name!r} -> {ent.linkname!r} names no earlier "
                          "regular file")
        sfd = self._dir(target[:-1], create=False, entry=ent.linkname)
        try:
            # The name may since have become a symlink (or another file): link only
            # the very inode this stream wrote there.
            st = os.stat(target[-1], dir_fd=sfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != known:
                raise Refused(f"hard link {ent.name!r} -> {ent.linkname!r}: the target is "
                              "no longer the file written there")
            self._clear(pfd, parts)
            os.link(target[-1], parts[-1], src_dir_fd=sfd, dst_dir_fd=pfd,
                    follow_symlinks=False)
        finally:
            os.close(sfd)
        self.files[tuple(parts)] = known

    def recheck_links(self) -> None:
        """Remove every symlink that now leads outside, until none does.

        A link checked when it was created can leave the tree once a later entry
        put a link into its path (``l -> s/x/../..`` with ``s -> .`` after it), and a
        removal can change what another link's path runs through: check again. A
        hostile chain could make that quadratic, so after a few rounds every link
        whose path runs through another link goes too; the rest cannot change."""
        for rounds in range(RECHECK_ROUNDS + 1):
            if not self._sweep(strict=rounds == RECHECK_ROUNDS):
                return

    def _sweep(self, strict: bool) -> bool:
        removed = False
        for cur, dirs, files in os.walk(self.tmp):
            rel = list(Path(cur).relative_to(self.tmp).parts)
            for name in dirs + files:
                path = os.path.join(cur, name)
                if not os.path.islink(path):
                    continue
                target = os.readlink(path)
                found = resolve_beneath(self.root, rel, target, max_links=0 if strict else None)
                if found is None:
                    os.unlink(path)
                    removed = True
                    self.result.entries -= 1
                    why = ("runs through another link" if strict else
                           "points outside the destination through a later entry")
                    self.result.refused.append(
                        f"symlink {'/'.join([*rel, name])!r} -> {target!r} {why}; removed")
        return removed

    def finish_dirs(self) -> None:
        """Directory modes and times, deepest first; then the whole tree made durable."""
        self._forget()
        for parts, (mode, mtime) in sorted(self.dirs.items(), key=lambda d: -len(d[0])):
            fd = self._dir(list(parts), create=False)
            try:
                if self.sync_each:
                    os.fsync(fd)
                if mtime is not None:
                    os.utime(fd, ns=(mtime, mtime))
                os.fchmod(fd, local_mode(mode, self.umask))
            finally:
                os.close(fd)
        os.fchmod(self.root, local_mode(self.root_mode, self.umask))
        if not self.sync_each:
            syncfs.syncfs(self.root)  # the private temp dir holds no mount point


def _exists(p: Path) -> bool:
    return os.path.lexists(p)


async def extract_dir(reader: TarReader, dest: Path,
                      on_bytes: Callable[[int], None] = lambda n: None) -> ExtractResult:
    """Extract ``reader`` as the new directory ``dest`` (which must not exist)."""
    if _exists(dest):
        raise LocalError.from_message(f"{dest} already exists; refusing to merge a directory "
                                      "copy into it")
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.ncp-", dir=dest.parent))
    ok = False
    try:
        ex = Extractor(tmp, current_umask())
        try:
            try:
                while await ex.entry(reader, on_bytes):
                    pass
            except TarError as exc:
                raise TransferError.from_message(f"directory stream: {exc}") from exc
            if not ex.complete:
                raise TransferError.from_message(
                    "directory stream ended without its completion record (cut short)")
            if (owed := ex.digests.owed()) is not None:
                raise TransferError.from_message(
                    f"directory stream ended before the sha256 of {owed!r}")
            ex.result.verified = bool(ex.digests.required)
            # Walks of the whole tree: off the event loop.
            await asyncio.to_thread(ex.recheck_links)
            try:
                await asyncio.to_thread(ex.finish_dirs)
            except OSError as exc:  # e.g. EIO from syncfs: the tree may not be on disk
                raise LocalError.from_message(f"cannot make the copy durable beside {dest}: "
                                              f"{exc.strerror}") from exc
        finally:
            ex.close()
        try:
            os.rename(tmp, dest)
        except OSError as exc:
            raise LocalError.from_message(f"cannot move the copy into place at {dest}: "
                                          f"{exc.strerror}") from exc
        fsync_dir(dest.parent)
        ok = True
        ex.result.path = str(dest)
        return ex.result
    finally:
        if not ok:
            shutil.rmtree(tmp, ignore_errors=True)


def _write_and_hash(fd: int, data: bytes, h: hashlib._Hash) -> None:
    _write_all(fd, data)
    h.update(data)  # releases the GIL: off the loop with the write


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]

