"""Extract a directory's PAX tar stream without trusting any entry.

Entries land in a fresh temp directory beside the destination, which is
renamed into place only once the stream ended with its ``AGGAPI.complete``
record. Names must be relative, free of '..' and NUL; every parent is walked
one component at a time with O_NOFOLLOW from the temp dir's fd, so neither a
'..' nor a symlink (one the tar itself created) leads out. Symlinks must point
inside the tree (relative, never above its root); hard links only to an earlier
regular file of the same tar. Device nodes, FIFOs and unknown types are
refused; setuid/setgid/sticky bits are dropped. Any violation fails the whole
copy and removes the temp dir: a hostile stream leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggapi.client.errors import LocalError, TransferError, UnsafeArchive
from aggapi.client.partial import fsync_dir
from aggapi.tarstream import CONT, DIR, LNK, REG, SYM, TarError, TarReader

CHUNK = 1 << 20
DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass
class ExtractResult:
    path: str
    entries: int = 0
    bytes: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)


def entry_parts(name: str) -> list[str]:
    """The path components of a tar entry name; [] for the root ("./")."""
    if "\0" in name:
        raise UnsafeArchive.from_message(f"tar entry name contains NUL: {name!r}")
    if name.startswith("/"):
        raise UnsafeArchive.from_message(f"tar entry has an absolute path: {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive.from_message(f"tar entry path contains '..': {name!r}")
    return parts


def link_stays_inside(parent: list[str], target: str) -> bool:
    """Whether a symlink in directory ``parent`` pointing to ``target`` stays in the tree."""
    if not target or target.startswith("/") or "\0" in target:
        return False
    depth = list(parent)
    for p in target.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not depth:
                return False
            depth.pop()
        else:
            depth.append(p)
    return True


class Extractor:
    """Write one tar stream into ``tmp`` (a new directory) using fds only."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.root = os.open(tmp, DIRFLAGS)
        self.files: set[tuple[str, ...]] = set()
        self.dirs: list[tuple[tuple[str, ...], int, int]] = []  # applied last (read-only dirs)
        self.complete = False
        self.result = ExtractResult(str(tmp))

    def close(self) -> None:
        os.close(self.root)

    def _dir(self, parts: list[str], create: bool = True) -> int:
        """An fd of the directory ``parts`` below the root; never follows a symlink."""
        fd = os.dup(self.root)
        try:
            for p in parts:
                try:
                    nfd = os.open(p, DIRFLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    os.mkdir(p, 0o700, dir_fd=fd)
                    nfd = os.open(p, DIRFLAGS, dir_fd=fd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        raise UnsafeArchive.from_message(
                            f"tar entry path crosses a symlink or file: {'/'.join(parts)!r}"
                        ) from exc
                    raise
                os.close(fd)
                fd = nfd
            return fd
        except BaseException:
            os.close(fd)
            raise

    @staticmethod
    def _clear(dfd: int, name: str) -> None:
        """Make room for a later entry of the same name, as tar does; never a directory."""
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            raise UnsafeArchive.from_message(f"tar entry {name!r} would replace a directory")
        os.unlink(name, dir_fd=dfd)

    async def entry(self, reader: TarReader, on_bytes: Callable[[int], None]) -> bool:
        ent = await reader.next()
        if ent is None:
            return False
        if ent.pax.get("AGGAPI.complete") == "true":
            self.complete = True
            with contextlib.suppress(ValueError, TypeError):
                self.result.skipped = list(json.loads(ent.pax.get("AGGAPI.skipped", "[]")))
        parts = entry_parts(ent.name)
        mtime = ent.mtime_ns
        if not parts:  # the root itself ("./"): nothing to create
            if ent.typeflag != DIR:
                raise UnsafeArchive.from_message("tar root entry is not a directory")
            return True
        parent, name = parts[:-1], parts[-1]
        if ent.typeflag == DIR:
            pfd = self._dir(parent)
            try:
                try:
                    os.mkdir(name, 0o700, dir_fd=pfd)
                except FileExistsError:
                    os.close(os.open(name, DIRFLAGS, dir_fd=pfd))  # must be a real dir
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise UnsafeArchive.from_message(
                        f"tar directory {ent.name!r} collides with a non-directory") from exc
                raise
            finally:
                os.close(pfd)
            self.dirs.append((tuple(parts), ent.mode & 0o777, mtime))
        elif ent.typeflag in (REG, CONT):
            pfd = self._dir(parent)
            try:
                self._clear(pfd, name)
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o600, dir_fd=pfd)
                try:
                    while chunk := await reader.read(CHUNK):
                        await asyncio.to_thread(_write_all, fd, chunk)
                        self.result.bytes += len(chunk)
                        on_bytes(len(chunk))
                    os.fchmod(fd, ent.mode & 0o777)
                    await asyncio.to_thread(os.fsync, fd)
                    os.utime(fd, ns=(mtime, mtime))
                finally:
                    os.close(fd)
            finally:
                os.close(pfd)
            self.files.add(tuple(parts))
        elif ent.typeflag == SYM:
            if not link_stays_inside(parent, ent.linkname):
                raise UnsafeArchive.from_message(
                    f"symlink {ent.name!r} -> {ent.linkname!r} points outside the destination")
            pfd = self._dir(parent)
            try:
                self._clear(pfd, name)
                os.symlink(ent.linkname, name, dir_fd=pfd)
            finally:
                os.close(pfd)
        elif ent.typeflag == LNK:
            target = tuple(entry_parts(ent.linkname))
            if target not in self.files:
                raise UnsafeArchive.from_message(
                    f"hard link {ent.name!r} -> {ent.linkname!r} names no earlier file")
            sfd = self._dir(list(target[:-1]), create=False)
            pfd = self._dir(parent)
            try:
                self._clear(pfd, name)
                os.link(target[-1], name, src_dir_fd=sfd, dst_dir_fd=pfd,
                        follow_symlinks=False)
            finally:
                os.close(sfd)
                os.close(pfd)
            self.files.add(tuple(parts))
        else:
            raise UnsafeArchive.from_message(
                f"tar entry {ent.name!r} has a refused type {ent.typeflag!r}")
        self.result.entries += 1
        return True

    def finish_dirs(self) -> None:
        for parts, mode, mtime in sorted(self.dirs, key=lambda d: -len(d[0])):
            fd = self._dir(list(parts), create=False)
            try:
                os.fsync(fd)
                os.utime(fd, ns=(mtime, mtime))
                os.fchmod(fd, mode)
            finally:
                os.close(fd)


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
        ex = Extractor(tmp)
        try:
            try:
                while await ex.entry(reader, on_bytes):
                    pass
            except TarError as exc:
                raise TransferError.from_message(f"directory stream: {exc}") from exc
            if not ex.complete:
                raise TransferError.from_message(
                    "directory stream ended without its completion record (cut short)")
            ex.finish_dirs()
            os.chmod(tmp, 0o755)
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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
