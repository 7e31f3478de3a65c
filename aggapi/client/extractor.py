"""Applying a directory's PAX tar entries into a new private directory, trusting none.

Every entry is placed by walking its parents one component at a time with O_NOFOLLOW
from the directory's fd, so no write ever goes through a symlink. An entry that would
not stay inside is refused on its own and reported (the copy goes on, like tar's
"member name contains '..'"), never created:

- names that are absolute, contain '..' or NUL, or cross a symlink or a file;
- symlinks whose target, resolved against the tree as it stands on disk (see
  :mod:`aggapi.client.confine`), leaves it; because a later entry can change
  what an earlier link's path runs through, every link is checked again once
  the stream ended (:mod:`aggapi.client.linkcheck`), until none is removed;
- hard links to anything but the very regular file an earlier entry wrote;
- devices, FIFOs, unknown types, and directories over a non-directory.

Every regular file's data is checked against its entry's sha256 (the PAX record
``AGGAPI.sha256``, :mod:`aggapi.tar.entrydigest`; where the stream says digests
trail, the next entry's ``AGGAPI.previousSha256``) before the tree is placed: a
mismatch fails the whole copy, naming the file. A stream that announces the records
(every current agent's) must carry one for every regular file; one from an older agent
(no announcement) is accepted without them, and the result says so.

Files and directories get the user's umask and no setuid/setgid/sticky bits, as
tar without -p does for a non-root user. A file is created with its final mode, so it
takes open, write, utime, fstat and close.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggapi.client.confine import local_mode, resolve_beneath
from aggapi.client.errors import IntegrityError
from aggapi.client.fastpath import FastPath
from aggapi.fs import syncfs
from aggapi.fs.dirfd import descend
from aggapi.tar.entrydigest import EntryDigests
from aggapi.tar.parse import ENTRY_END, TarParser
from aggapi.tar.stream import CONT, DIR, LNK, REG, SYM, TarEntry

DIRFLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
CARRY_MAX = 64 << 10  # the most of a cut entry held back for the next piece


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


@dataclass
class _Open:
    """The regular file whose data is arriving: written and hashed as it comes."""

    fd: int
    key: tuple[str, ...]
    name: str
    want: str | None  # its AGGAPI.sha256, if the entry carries one
    mtime_ns: int
    hash: Any = field(default_factory=hashlib.sha256)


class Extractor:
    """Write one tar stream into ``tmp`` (a new private directory) using fds only.

    Synchronous, run in a worker thread: :meth:`feed` parses one piece of the stream and
    applies every event it completes, so a piece holding a dozen small files costs one
    hand-off from the event loop, not a dozen (and their syscalls run beside the loop's
    TLS work, the GIL released)."""

    def __init__(self, tmp: Path, umask: int, parser: TarParser | None = None, *,
                 fast: bool = True) -> None:
        self.tmp = tmp
        self.umask = umask
        self.parser = parser or TarParser()
        self.root = os.open(tmp, DIRFLAGS)
        # Regular files this stream wrote, by path: hard links may only name these,
        # and only while the same inode is still there.
        self.files: dict[tuple[str, ...], tuple[int, int]] = {}
        self.dirs: dict[tuple[str, ...], tuple[int, int | None]] = {}  # applied last
        self.root_mode = 0o777
        self.links = 0  # symlinks made: none (a source tree, usually), nothing to recheck
        self.complete = False
        self.result = ExtractResult(str(tmp))
        self.sync_each = not syncfs.available()  # else one syncfs in finish_dirs
        self.digests = EntryDigests(trailing_ok=True)  # ncp asks for digest=trailer
        self._out: _Open | None = None  # the file being written, if any
        # Where digests trail: the last regular file written, and the sha256 it had,
        # checked against the next entry's record before anything is placed.
        self.written: tuple[str, str] | None = None
        self._last: tuple[tuple[str, ...], int] | None = None  # the last parent, its fd
        self._fast = FastPath.make(self) if fast else None
        self._carry = b""  # the start of an entry the next piece completes (fast path)

    def close(self) -> None:
        out, self._out = self._out, None
        if out is not None:
            os.close(out.fd)
        self._forget()
        os.close(self.root)

    def _forget(self) -> None:
        last, self._last = self._last, None
        if last is not None:
            os.close(last[1])

    def feed(self, data: bytes | memoryview) -> int:
        """Parse ``data`` (the next piece of the stream; a view of a receive buffer
        too) and apply what it completes; the data bytes written. Work is linear in
        ``len(data)``: a refused entry's data is dropped, a big file's is written a
        piece at a time. Where the compiled loop is built
        (:mod:`aggapi.client.fastpath`), it applies the plain files and this the rest,
        one entry at a time."""
        fast = self._fast
        if fast is None:
            written = self._events(data, 0, stop=False)[1]
        else:
            if self._carry:
                data, self._carry, carried = self._carry + data, b"", True
            else:
                carried = False
            written, pos, end, parser = 0, 0, len(data), self.parser
            while (pos := parser.skip_pad(pos, end)) < end:
                if parser.at_boundary():
                    pos, n, short = fast.run(data, pos)
                    written += n
                    # A small entry cut by the piece's end waits for the next piece (at
                    # most once: each byte is copied once more at most).
                    if short and end - pos <= CARRY_MAX and not (carried and pos == 0):
                        self._carry = bytes(data[pos:])  # (a view's bytes: + needs bytes)
                        break
                    if pos >= end:
                        break
                pos, n = self._events(data, pos, stop=True)
                written += n
        self.result.bytes += written
        return written

    def end_of_stream(self) -> None:
        """The stream ended: apply what was held back, then fail if the archive did
        not end (:meth:`TarParser.close`)."""
        carry, self._carry = self._carry, b""
        if carry:
            self.result.bytes += self._events(carry, 0, stop=False)[1]
        self.parser.close()

    def feed_pieces(self, pieces: list[bytes | memoryview]) -> int:
        """:meth:`feed` each piece in turn (what arrived while the last batch was
        applied): one hand-off to a worker, no join."""
        return sum(self.feed(piece) for piece in pieces)

    def _events(self, data: bytes | memoryview, pos: int, stop: bool) -> tuple[int, int]:
        """Apply the events of ``data[pos:]``, to the end of the piece or, with
        ``stop``, to the end of the next entry: where it stopped, and the data bytes
        written."""
        written = 0
        parser = self.parser
        for ev in parser.feed(data, pos):
            if isinstance(ev, bytes | memoryview):
                out = self._out
                if out is not None:
                    _write_all(out.fd, ev)
                    out.hash.update(ev)  # (releases the GIL above 2 KiB)
                    written += len(ev)
            elif isinstance(ev, TarEntry):
                self._begin(ev)
            elif ev is ENTRY_END:
                if self._out is not None:
                    self._finish_file()
                if stop:
                    return parser.pos, written
        return len(data), written

    def _begin(self, ent: TarEntry) -> None:
        want = self.digests.expected(ent)  # a TarError fails the copy
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
            self._place(ent, want)
        except Refused as exc:
            self.result.refused.append(str(exc))  # its data, if any, is dropped

    def _parent(self, parts: list[str], entry: str) -> int:
        """The fd of the directory ``parts``, owned by the extractor (the caller must not
        close it): the last one is kept, as a tar lists a directory's entries together.
        A directory, once made, is never replaced, so the fd stays the path's."""
        key = tuple(parts)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        fd = self._dir(parts, entry=entry)
        self._forget()
        self._last = (key, fd)
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

    def _place(self, ent: TarEntry, want: str | None) -> None:
        parts = entry_parts(ent.name)
        if not parts:  # the root itself ("./"): nothing to create
            if ent.typeflag != DIR:
                raise Refused("tar root entry is not a directory")
            self.root_mode = ent.mode
            return
        pfd = self._parent(parts[:-1], ent.name)
        if ent.typeflag == DIR:
            self._mkdir(pfd, parts, ent)
        elif ent.typeflag in (REG, CONT):
            self._create(pfd, parts, ent, want)
        elif ent.typeflag == SYM:
            if resolve_beneath(self.root, parts[:-1], ent.linkname) is None:
                raise Refused(f"symlink {ent.name!r} -> {ent.linkname!r} points outside "
                              "the destination")
            self._clear(pfd, parts)
            os.symlink(ent.linkname, parts[-1], dir_fd=pfd)
            self.links += 1
        elif ent.typeflag == LNK:
            self._hardlink(pfd, parts, ent)
        else:
            raise Refused(f"tar entry {ent.name!r} has a refused type {ent.typeflag!r}")
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

    def _create(self, pfd: int, parts: list[str], ent: TarEntry, want: str | None) -> None:
        # Created with its final mode (the umask already out of it, as open applies it
        # too): no fchmod after. Our fd writes whatever the mode says.
        mode = local_mode(ent.mode, self.umask)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:  # a new name (the usual case) costs no lstat first
            fd = os.open(parts[-1], flags, mode, dir_fd=pfd)
        except FileExistsError:
            self._clear(pfd, parts)
            fd = os.open(parts[-1], flags, mode, dir_fd=pfd)
        self._out = _Open(fd, tuple(parts), ent.name, want, ent.mtime_ns)

    def _finish_file(self) -> None:
        out = self._out
        assert out is not None
        try:
            got = out.hash.hexdigest()
            if out.want is not None and got != out.want:
                raise IntegrityError.from_message(
                    f"sha256 mismatch for {out.name!r}: got {got}, the server sent "
                    f"{out.want}; nothing was placed")
            if self.digests.trailing:  # its digest comes with the next entry
                self.written = (out.name, got)
            if self.sync_each:
                os.fsync(out.fd)
            os.utime(out.fd, ns=(out.mtime_ns, out.mtime_ns))
            st = os.fstat(out.fd)
        finally:
            self._out = None
            os.close(out.fd)
        self.files[out.key] = (st.st_dev, st.st_ino)

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



def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
