"""A local directory as a PAX tar stream, for uploads with ``format=tar``.

Nothing is followed: symlinks are sent as symlinks, every file is opened with
O_NOFOLLOW and must still be the regular file that was listed. Devices, FIFOs
and sockets are skipped and reported. Names are relative to the directory.
Without ``preserve`` (``ncp --no-preserve``, like ``kubectl cp --no-preserve``) the
local permissions stay home: files go as 0644 and directories as 0755, what a new
entry gets in the container. Owners never travel (uid/gid 0 in the headers; the agent
sets the copy's own user).

Every regular file's entry carries its data's sha256 (the PAX record ``AGGAPI.sha256``,
:mod:`aggapi.tar.entrydigest`), which the agent checks before the file is renamed into
place; the tar starts with the global record that announces it. The digest goes in the
header, before the data: a file of up to :data:`READ_WHOLE` bytes is read once into
memory, hashed and sent from there; a bigger one is hashed first and read again to be
sent. The whole tar's sha256 may then leave that data out (the headers digest): each
file is hashed once. Digests are kept by name in the caller's ``digests``, so a second pass over the
same listing (a retry after a cut, or a tree too big to keep in memory hashed before it
is sent) hashes nothing again; a file that changed in between fails its check on the
agent, which names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
from collections.abc import AsyncIterator, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggapi.client.errors import LocalError
from aggapi.tar.entrydigest import ANNOUNCEMENT, PLACEHOLDER, record
from aggapi.tar.stream import DIR, END, REG, SYM, header, header_size, pad

CHUNK = 1 << 20
# Files up to this size are read once, into memory (one at a time); bigger ones twice.
READ_WHOLE = 16 << 20
# What the agent gives a new file or directory when no mode is asked for.
DEFAULT_FILE_MODE, DEFAULT_DIR_MODE = 0o644, 0o755


@dataclass
class Listing:
    entries: list[tuple[str, os.stat_result]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    data_bytes: int = 0


def list_tree(root: Path) -> Listing:
    """Every entry under ``root`` (parents first), without following symlinks."""
    out = Listing()

    def walk(d: Path, rel: str) -> None:
        with os.scandir(d) as it:
            items = sorted(it, key=lambda e: e.name)
        for e in items:
            r = f"{rel}{e.name}"
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                out.entries.append((r, st))
                walk(Path(e.path), r + "/")
            elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                out.entries.append((r, st))
                if stat.S_ISREG(st.st_mode):
                    out.data_bytes += st.st_size
            else:
                out.skipped.append(r)

    walk(root, "")
    return out


def entry_mode(st: os.stat_result, preserve: bool) -> int:
    """The mode an entry is sent with: its own, or the container's default."""
    if preserve:
        return stat.S_IMODE(st.st_mode)
    return DEFAULT_DIR_MODE if stat.S_ISDIR(st.st_mode) else DEFAULT_FILE_MODE


Piece = tuple[bytes, bool]  # a piece of the tar, and whether it is a file's data


def _pieces(root: Path, listing: Listing, preserve: bool,
            digests: dict[str, str]) -> Generator[Piece, None, None]:
    """The tar of ``listing`` piece by piece (headers, file data, padding), each marked
    whether it is a file's data (which its AGGAPI.sha256 record covers), read with
    blocking calls: run in a worker thread by :func:`tar_stream`."""
    yield _announcement(listing), False
    for rel, st in listing.entries:
        full = root / rel
        mtime = st.st_mtime_ns
        if stat.S_ISDIR(st.st_mode):
            yield header(rel + "/", DIR, mode=entry_mode(st, preserve), mtime_ns=mtime), False
        elif stat.S_ISLNK(st.st_mode):
            yield header(rel, SYM, mode=0o777, mtime_ns=mtime,
                         linkname=os.readlink(full)), False
        else:
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError as exc:
                raise LocalError.from_message(f"cannot read {full}: {exc.strerror}") from exc
            try:
                now = os.fstat(fd)
                if not stat.S_ISREG(now.st_mode) or now.st_ino != st.st_ino:
                    raise LocalError.from_message(f"{full} changed while being copied")
                size = st.st_size
                data = None
                digest = digests.get(rel)
                if digest is None:
                    if size <= READ_WHOLE:
                        data = _read(fd, size, full)
                        digest = hashlib.sha256(data).hexdigest()
                    else:
                        digest = _hash(fd, size, full)
                    digests[rel] = digest
                yield header(rel, REG, size=size, mode=entry_mode(st, preserve),
                             mtime_ns=mtime, records=record(digest)), False
                if data is not None:
                    yield data, True
                else:
                    for chunk in _chunks(fd, size, full):
                        yield chunk, True
                yield pad(size), False
            finally:
                os.close(fd)
    yield END, False


def _announcement(listing: Listing) -> bytes:
    # Not in an empty tar: a global header with no entry after it is "an unexpected end"
    # to Python's tarfile.
    return ANNOUNCEMENT if listing.entries else b""


def _read(fd: int, size: int, full: Path) -> bytes:
    """The file's ``size`` bytes, in one read for all but big files."""
    data = os.read(fd, size) if size else b""
    if len(data) < size:
        data += b"".join(_chunks(fd, size - len(data), full))
    return data


def _chunks(fd: int, size: int, full: Path) -> Iterator[bytes]:
    left = size
    while left:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            raise LocalError.from_message(f"{full} shrank while being copied")
        left -= len(chunk)
        yield chunk


def _hash(fd: int, size: int, full: Path) -> str:
    h = hashlib.sha256()
    for chunk in _chunks(fd, size, full):
        h.update(chunk)
    os.lseek(fd, 0, os.SEEK_SET)  # read again to be sent
    return h.hexdigest()


def _batch(pieces: Iterator[Piece], hasher: Any | None, headers_only: bool) -> bytes:
    """The next CHUNK or so of the tar: one piece as it is (a big file's read), or many
    small ones joined, fed to ``hasher`` (a hashlib object) here in the worker, all of
    it or with ``headers_only`` all but the files' data (the headers digest of
    :mod:`aggapi.tar.entrydigest`). b"" at the end."""
    got: list[bytes] = []
    n = 0
    part = hasher if headers_only else None
    for piece, data in pieces:
        got.append(piece)
        n += len(piece)
        if part is not None and not data and piece:
            part.update(piece)
        if n >= CHUNK:
            break
    out = got[0] if len(got) == 1 else b"".join(got)
    if hasher is not None and not headers_only:
        hasher.update(out)
    return out


async def tar_stream(root: Path, listing: Listing, *, preserve: bool = True,
                     digests: dict[str, str] | None = None,
                     hasher: Any | None = None, headers_only: bool = False
                     ) -> AsyncIterator[bytes]:
    """The tar of ``listing``, in pieces of about CHUNK bytes, fed to ``hasher`` whole or
    with ``headers_only`` without the files' data; fails if a file changed between
    listing and reading.

    A worker thread builds each piece (opens, reads, headers): one hand-off per MiB, not
    per file. A tree of small files would otherwise cost a thread hop per file and three
    pieces per file (header, data, padding), each its own write, TLS record and relay
    hop on every side of the copy."""
    pieces = _pieces(root, listing, preserve, {} if digests is None else digests)
    try:
        headers = headers_only and hasher is not None
        while piece := await asyncio.to_thread(_batch, pieces, hasher, headers):
            yield piece
    finally:
        # Closes the file a batch left open mid-file. A cancelled batch may still run in
        # its worker ("generator already executing"): the generator's finalizer closes
        # the file once that worker lets go of it.
        with contextlib.suppress(ValueError):
            pieces.close()


def tar_size(root: Path, listing: Listing) -> int:
    """The exact length :func:`tar_stream` will produce (for progress and Content-Length;
    the mode is a fixed-width field, so ``preserve`` does not change it)."""
    n = len(_announcement(listing)) + len(END)
    for rel, st in listing.entries:
        if stat.S_ISDIR(st.st_mode):
            n += header_size(rel + "/", mtime_ns=st.st_mtime_ns)
        elif stat.S_ISLNK(st.st_mode):
            n += header_size(rel, mtime_ns=st.st_mtime_ns, linkname=os.readlink(root / rel))
        else:
            n += header_size(rel, size=st.st_size, mtime_ns=st.st_mtime_ns,
                             records=PLACEHOLDER) + st.st_size \
                + len(pad(st.st_size))
    return n
