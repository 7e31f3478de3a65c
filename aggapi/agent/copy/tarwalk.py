"""A directory tree out of a container as a PAX tar, walked by file descriptors.

Nothing is followed: the walk opens every child by a single name relative to its parent's fd with
O_NOFOLLOW. Symlinks are sent as symlinks, hard links as links to the first
name seen, regular files are re-opened for reading through /proc/self/fd from
their O_PATH fd (so a name swapped for a device or FIFO is never opened), and
devices, FIFOs and sockets are skipped. Files and directories on kernel pseudo
file systems (procfs, sysfs, cgroupfs...: see aggapi.agent.copy.pseudofs) are
skipped: their sizes are made up. No file is read past the size fstat gave when it
was opened. Every regular file's entry carries its data's
sha256 (``AGGAPI.sha256``, :mod:`aggapi.tar.entrydigest`), computed from the bytes sent:
a file of up to a chunk is read once and sent from memory, a bigger one is hashed
first (in steps of a chunk, so a walk step stays bounded) and read again to be sent.
Asked with digest=trailer (``trailing``), every file is read once, hashed as it is
sent, and its sha256 goes on the entry after it (``AGGAPI.previousSha256``).

Asked without ``digest`` (``plain``), the tar is a plain one that any tar extracts
silently into the user's directory: no vendor record, no closing "./" entry (which
would change the mode, owner and time of the directory extracted into), nothing
skipped reported. Otherwise (ncp asks with digest=trailer), skipped entries are
reported at the end of the stream: the last entry is
"./" (the directory itself, a no-op for extractors) whose PAX extended header
carries the vendor keywords ``AGGAPI.skipped`` (JSON list of {path, type, reason}),
``AGGAPI.entries``, ``AGGAPI.bytes`` and ``AGGAPI.complete=true``. An HTTP
trailer would be dropped by proxies, and a header sent up front cannot know
about entries that change during the walk. A stream without the
``AGGAPI.complete`` record was cut short. Entry count, depth and bytes are
capped: checked up front by :func:`measure` (413) and again while streaming
(the stream is then aborted). Everything here blocks: run it in workers.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from aggapi.agent.copy import fastwalk
from aggapi.agent.copy.download import file_type, reopen
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.pseudofs import pseudo_fs
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.status import StatusError
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, TRAILING_ANNOUNCEMENT, previous, record

CHUNK = 1 << 20
PSEUDO_REASON = "on a kernel pseudo file system (procfs, sysfs...); not copied"


def _why(exc: OSError) -> str:
    """The skip reason for an entry that could not be opened."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    return f"changed while being read: {exc.strerror}"


def _open_child_dir(dfd: int, name: str) -> int | None:
    """An fd of subdirectory ``name``; None when it is on a pseudo file system."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    if pseudo_fs(fd) is not None:
        os.close(fd)
        return None
    return fd


def _names(dfd: int, limits: CopyLimits, seen: int) -> list[str]:
    names = []
    with os.scandir(dfd) as it:
        for e in it:
            names.append(e.name)
            if seen + len(names) > limits.max_entries:
                raise StatusError(413, f"directory has more than {limits.max_entries} entries")
    names.sort()
    return names


def measure(dir_fd: int, limits: CopyLimits) -> tuple[int, int]:
    """(entries, bytes) of a tree, or a 413 as soon as a cap is passed."""
    entries = 0
    size = 0
    stack: list[tuple[int, int]] = [(os.dup(dir_fd), 0)]
    try:
        while stack:
            dfd, depth = stack.pop()
            try:
                for name in _names(dfd, limits, entries):
                    entries += 1
                    try:
                        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    except OSError:  # gone, or not searchable by the container's user
                        continue
                    if stat.S_ISREG(st.st_mode):
                        size += st.st_size
                        if size > limits.size_limit:
                            raise StatusError(413, f"directory holds more than "
                                              f"{limits.size_limit} bytes")
                    elif stat.S_ISDIR(st.st_mode):
                        if depth + 1 > limits.max_depth:
                            raise StatusError(413, f"directory is nested deeper than "
                                              f"{limits.max_depth} levels")
                        try:
                            cfd = _open_child_dir(dfd, name)
                        except OSError:
                            continue
                        if cfd is not None:
                            stack.append((cfd, depth + 1))
            finally:
                os.close(dfd)
    finally:
        for dfd, _ in stack:
            os.close(dfd)
    return entries, size


@dataclass
class TarWalker:
    """Generates the PAX tar of a directory in chunks of about 1 MiB."""

    root: FsRoot
    dir_fd: int
    limits: CopyLimits
    entries: int = 0
    size: int = 0
    skipped: list[dict[str, str]] = field(default_factory=list)
    links: dict[tuple[int, int], str] = field(default_factory=dict)
    # digest=trailer: each regular file's sha256 goes on the entry after it (read once,
    # hashed as sent); ``owed`` holds it until that entry's header is built.
    trailing: bool = False
    owed: str | None = None
    # A plain tar (a download asked without ``digest``: ``kubectl get --raw | tar x``):
    # no AGGAPI.* record and no closing "./" entry, which would set the mode, owner and
    # time of the directory the user extracts into; each file read once.
    plain: bool = False
    # The compiled loop of plain small files (aggapi.agent.copy.fastwalk), where built:
    # digest=trailer walks only (ncp's); the Python path below is the reference.
    fast: bool = field(default_factory=fastwalk.loaded)

    def __post_init__(self) -> None:
        self.fast = self.fast and self.trailing and not self.plain

    def _header(self, name: str, typeflag: bytes, *, records: dict[str, str] | None = None,
                **kw: Any) -> bytes:
        """An entry's header block(s), carrying the trailing digest of the file before."""
        owed, self.owed = self.owed, None
        return ts.header(name, typeflag, records={**previous(owed), **(records or {})}, **kw)

    def skip(self, rel: str, kind: str, reason: str) -> None:
        self.skipped.append({"path": rel, "type": kind, "reason": reason})

    def _ids(self, st: os.stat_result) -> tuple[int, int]:
        return self.root.uid_map.to_container(st.st_uid), self.root.gid_map.to_container(st.st_gid)

    def _count(self, nbytes: int = 0) -> None:
        self.entries += 1
        self.size += nbytes
        if self.entries > self.limits.max_entries or self.size > self.limits.size_limit:
            raise StatusError(413, "directory grew past the copy limits while being sent")

    def chunks(self) -> Generator[bytes, None, None]:
        # Every regular file's sha256 is in its entry, or with trailing the next entry's.
        buf: list[bytes] = [] if self.plain else [
            TRAILING_ANNOUNCEMENT if self.trailing else ANNOUNCEMENT]
        held = sum(map(len, buf))
        for piece in self._walk(self.dir_fd, "", 0):
            if piece is None:  # a step of a big file's hash: let the caller check in
                yield b"".join(buf)
                buf, held = [], 0
                continue
            if len(piece) >= CHUNK and not buf:
                yield piece
                continue
            buf.append(piece)
            held += len(piece)
            if held >= CHUNK:
                yield b"".join(buf)
                buf, held = [], 0
        if not self.plain:
            buf.append(self.manifest())
        buf.append(ts.END)
        yield b"".join(buf)

    def manifest(self) -> bytes:
        """The closing "./" entry (the directory itself) carrying the AGGAPI.* report."""
        st = os.fstat(self.dir_fd)
        uid, gid = self._ids(st)
        records = {
            "AGGAPI.entries": str(self.entries),
            "AGGAPI.bytes": str(self.size),
            "AGGAPI.skipped": json.dumps(self.skipped, separators=(",", ":")),
            "AGGAPI.complete": "true",
            **previous(self.owed),  # the last file's, where digests trail
        }
        self.owed = None
        return (ts.pax_header("./PaxHeader", records, typeflag=ts.PAX)
                + ts.header("./", ts.DIR, mode=stat.S_IMODE(st.st_mode), uid=uid, gid=gid,
                            mtime_ns=st.st_mtime_ns - st.st_mtime_ns % 1_000_000_000))

    def _walk(self, dfd: int, prefix: str, depth: int) -> Iterator[bytes | None]:
        """The tar's pieces; None after each MiB a big file's hash read (a step)."""
        dev = os.fstat(dfd).st_dev  # a real file system's (pseudo ones are not walked)
        names = _names(dfd, self.limits, self.entries)
        taken = 0  # the names before this one went through the compiled loop
        for i, name in enumerate(names):
            if i < taken:
                continue
            if self.fast:  # the run of plain small files from here, if any (fastwalk)
                taken, piece = fastwalk.files(self, dfd, dev, names, i, prefix)
                if piece:
                    yield piece
                if taken > i:
                    continue
            rel = prefix + name
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:  # a directory its user may list but not search
                self.skip(rel, "unknown", _why(exc))
                continue
            uid, gid = self._ids(st)
            common: dict[str, Any] = {"mode": stat.S_IMODE(st.st_mode), "uid": uid, "gid": gid,
                                      "mtime_ns": st.st_mtime_ns}
            if stat.S_ISDIR(st.st_mode):
                if depth + 1 > self.limits.max_depth:
                    raise StatusError(413, "directory grew deeper than the copy limit")
                try:
                    cfd = _open_child_dir(dfd, name)
                except OSError as exc:
                    self.skip(rel, "dir", _why(exc))
                    continue
                if cfd is None:
                    self.skip(rel, "dir", PSEUDO_REASON)
                    continue
                try:
                    self._count()
                    yield self._header(rel + "/", ts.DIR, **common)
                    yield from self._walk(cfd, rel + "/", depth + 1)
                finally:
                    os.close(cfd)
            elif stat.S_ISLNK(st.st_mode):
                try:
                    target = os.readlink(name, dir_fd=dfd)
                except OSError as exc:
                    self.skip(rel, "symlink", _why(exc))
                    continue
                self._count()
                yield self._header(rel, ts.SYM, linkname=target, **common)
            elif stat.S_ISREG(st.st_mode):
                yield from self._file(dfd, dev, name, rel, common)
            else:
                self.skip(rel, file_type(st.st_mode), "special files are not copied")

    def _file(self, dfd: int, dev: int, name: str, rel: str, common: dict[str, Any]
              ) -> Iterator[bytes | None]:
        try:
            pfd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as exc:
            self.skip(rel, "file", _why(exc))
            return
        try:
            st = os.fstat(pfd)
            if not stat.S_ISREG(st.st_mode):
                self.skip(rel, file_type(st.st_mode), "changed while being read")
                return
            # A pseudo file bind-mounted into the tree is on another file system than
            # its directory: only then is fstatfs worth a call per file.
            if st.st_dev != dev and pseudo_fs(pfd) is not None:
                self.skip(rel, "file", PSEUDO_REASON)
                return
            key = (st.st_dev, st.st_ino)
            if st.st_nlink > 1:
                first = self.links.get(key)
                if first is not None:
                    self._count()
                    yield self._header(rel, ts.LNK, linkname=first, **common)
                    return
            try:
                fd = reopen(pfd, os.O_RDONLY, st)
            except OSError as exc:  # e.g. a file the container's user may not read
                self.skip(rel, "file", _why(exc))
                return
            if st.st_nlink > 1:
                self.links[key] = rel
        finally:
            os.close(pfd)
        try:
            size = st.st_size
            self._count(size)
            if self.plain:
                yield self._header(rel, ts.REG, size=size, **common)
                yield from self._data(fd, rel, size)
                return
            if self.trailing:
                yield from self._file_trailing(fd, rel, size, common)
                return
            if size <= CHUNK:  # read once: hashed, then sent from memory
                data = os.pread(fd, size, 0) if size else b""
                if len(data) < size:
                    data = self._shrank(rel, data, size)
                yield self._header(rel, ts.REG, size=size, **common,
                                   records=record(hashlib.sha256(data).hexdigest()))
                yield data
                yield ts.pad(size)
                return
            # The digest goes in the header, before the data: a bigger file is read
            # twice (hashed, then sent; a second read from the page cache), as a single
            # file's download is. A change in between fails the copy on the client.
            h = hashlib.sha256()
            yield from _hash_steps(fd, size, h)
            yield self._header(rel, ts.REG, size=size, **common, records=record(h.hexdigest()))
            yield from self._data(fd, rel, size)
        finally:
            os.close(fd)

    def _file_trailing(self, fd: int, rel: str, size: int, common: dict[str, Any]
                       ) -> Iterator[bytes]:
        """The entry of a regular file read once, a chunk at a time, hashed as it goes;
        its digest is owed to the next entry."""
        if size <= CHUNK:  # one piece (header, data, padding): a small file is one
            data = os.pread(fd, size, 0) if size else b""  # read and one yield up the
            if len(data) < size:  # walk's generators, not three
                data = self._shrank(rel, data, size)
            head = self._header(rel, ts.REG, size=size, **common)  # takes the owed digest
            self.owed = hashlib.sha256(data).hexdigest()
            yield b"".join((head, data, ts.pad(size)))
            return
        yield self._header(rel, ts.REG, size=size, **common)
        h = hashlib.sha256()
        yield from self._data(fd, rel, size, h)
        self.owed = h.hexdigest()

    def _data(self, fd: int, rel: str, size: int, h: hashlib._Hash | None = None
              ) -> Iterator[bytes]:
        """A regular file's data, a chunk at a time, then its padding; hashed into ``h``
        as it is read, if given."""
        off = 0
        while off < size:
            data = os.pread(fd, min(CHUNK, size - off), off)
            if not data:  # shrank under us: keep the archive well-formed
                data = self._shrank(rel, b"", min(CHUNK, size - off))
            if h is not None:
                h.update(data)
            off += len(data)
            yield data
        yield ts.pad(size)

    def _shrank(self, rel: str, data: bytes, size: int) -> bytes:
        self.skip(rel, "file", "shrank while being read; padded with zeros")
        return data + b"\0" * (size - len(data))


def _hash_steps(fd: int, size: int, h: hashlib._Hash) -> Iterator[None]:
    """Hash the file's first ``size`` bytes (zeros for any it no longer has) into ``h``,
    yielding None after each chunk: every step of the walk stays about a MiB
    of work, so a client that leaves frees its worker within a chunk, not a file."""
    off = 0
    while off < size:
        data = os.pread(fd, min(CHUNK, size - off), off) or b"\0" * min(CHUNK, size - off)
        h.update(data)
        off += len(data)
        yield None
