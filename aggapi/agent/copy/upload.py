"""Uploads: one raw file, or a tar extracted into a directory, never in place.

Raw: the body streams into an :class:`~aggapi.agent.copy.atomic.AtomicFile` in
the target's directory (resolved in-root with openat2) in 1 MiB batches, one
batch being written by a worker while the next arrives (:mod:`aggapi.fs.pump`): memory
does not grow with the file size. From --copy-direct-io-min-size bytes (or an unknown
length) the file is written with O_DIRECT (:mod:`aggapi.agent.copy.directio`).

Tar (``format=tar``): the body is parsed as a stream (never extractall), in worker
threads with bounded metadata (:mod:`aggapi.agent.copy.untar`). Entry
names must be relative and free of '..' and NUL; every entry is resolved under
the target directory with openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), so
neither '..' nor a symlink (from the tar or swapped in by the container) can
lead out. Regular files, symlinks and hard links are written as temp files and
renamed into place only after the whole tar was read and its size and sha256
checked, and each regular file against its own entry's sha256 (the record
``AGGAPI.sha256``, :mod:`aggapi.tar.entrydigest`; a mismatch names the file). With
``sha256=headers...`` the tar's sha256 is its headers digest, which leaves out the data
of the files checked against their records: their data is hashed once. A hard
link may only name an earlier regular file of the same tar.
Device nodes and FIFOs are refused. Missing directories are created as the tar
goes and removed again if the upload fails. Tar entry modes lose setuid/setgid;
owners are the uid=/gid= parameters or the user the copy acts as (the container
process's; its root under --copy-as-root, as docker cp), and the kernel decides,
as that user, whether the owner may be set. The per-entry file-system work is in
:mod:`aggapi.agent.copy.tarextract`.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import StreamReader

from aggapi.agent.copy.atomic import (
    AtomicFile,
    check_replaceable,
)
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.fserrors import fs_status
from aggapi.agent.copy.fsroot import FsRoot, check_name, split_parent
from aggapi.agent.copy.settle import call, settle
from aggapi.agent.copy.state import CopyState
from aggapi.agent.copy.tarextract import TarExtractor
from aggapi.agent.copy.targetdir import RDIR, open_target_dir, remove_created_target
from aggapi.agent.copy.untar import TarSink
from aggapi.agent.copy.uploadparams import UploadParams
from aggapi.fs.pump import next_piece, pump
from aggapi.status import StatusError
from aggapi.tar.stream import ByteStream, TarError
from aggapi.wire import SHA256_TRAILER_SIZE


def _counted(body: ByteStream, state: CopyState,
             params: UploadParams) -> Callable[[int], Awaitable[bytes]]:
    """``read`` for :func:`aggapi.fs.pump.pump`: the body's pieces as received (never
    joined), their running total checked against the size limit (which a sha256
    trailer does not count against)."""
    received = -SHA256_TRAILER_SIZE if params.sha256_trailer else 0

    async def read(n: int) -> bytes:
        nonlocal received
        data = await (next_piece(body) if isinstance(body, StreamReader) else body.read(n))
        received += len(data)
        state.slots.check_size(received)
        return data

    return read


class Expected:
    """What the body must turn out to be: its data size and sha256, from the request
    (Content-Length, sha256=) or, with sha256=trailer, from the body's own last 32
    bytes, which ``read`` keeps out of the data."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]], content_length: int | None,
                 params: UploadParams) -> None:
        self._read = read  # a _counted read
        self._sha256 = params.sha256
        self.size = content_length
        self._tail: bytearray | None = None
        self._left = 0
        if params.sha256_trailer:
            if content_length is None or content_length < SHA256_TRAILER_SIZE:
                raise StatusError(411, "sha256=trailer needs a Content-Length of at least "
                                  f"{SHA256_TRAILER_SIZE} (the trailer)")
            self.size = self._left = content_length - SHA256_TRAILER_SIZE
            self._tail = bytearray()

    async def read(self, n: int) -> bytes:
        """The next data piece (b"" at the end); with a trailer, the piece that crosses
        into it is split (the only copy), and the trailer's bytes are kept aside."""
        while True:
            data = await self._read(n)
            if self._tail is None or len(data) <= self._left:
                self._left -= len(data) if self._tail is not None else 0
                return data
            head, self._left = data[:self._left], 0
            self._tail += data[len(head):]
            if head:
                return head

    @property
    def sha256(self) -> str | None:
        """The sha256 (hex) the data must have; call after the whole body was read."""
        if self._tail is None:
            return self._sha256.lower() if self._sha256 is not None else None
        if len(self._tail) != SHA256_TRAILER_SIZE:  # Content-Length holds it to at most 32
            raise StatusError(400, f"the body ended inside its sha256 trailer "
                              f"({len(self._tail)} of {SHA256_TRAILER_SIZE} bytes); target "
                              "unchanged")
        return bytes(self._tail).hex()

    def check(self, digest: str, path: str) -> None:
        want = self.sha256
        if want is not None and digest != want:
            raise StatusError(400, f"{path}: sha256 mismatch: received {digest}, expected "
                              f"{want}; target unchanged", reason="Invalid")


async def upload_file(state: CopyState, root: FsRoot, path: str, body: ByteStream,
                      content_length: int | None, params: UploadParams) -> dict[str, Any]:
    parent, name = split_parent(path)
    if not name:
        raise StatusError(409, "/: is a directory")
    check_name(name)
    want = Expected(_counted(body, state, params), content_length, params)
    if want.size is not None:
        state.slots.check_size(want.size)
    run = state.workers.run
    record = InflightRecord(state.limits.state_dir, root)
    try:
        # call: a client leaving while the worker opens gets the fd closed, not leaked.
        dir_fd = await call(state.workers, root.open, parent, RDIR, undo=os.close)
    except OSError as exc:  # the record has no file yet (temp_name makes it)
        raise fs_status(exc, parent) from exc
    af: AtomicFile | None = None
    try:
        replaced = await call(state.workers, check_replaceable, dir_fd, name, path,
                              params.overwrite)
        least = state.limits.direct_io_min_size
        direct = least > 0 and (want.size is None or want.size >= least)
        # call: the temp file a worker creates for a client that has left is removed.
        af = await call(state.workers, functools.partial(
            AtomicFile, root, record, dir_fd, parent, name, direct=direct),
            undo=AtomicFile.abort)
        # Hashed in AtomicFile.write_many, in a worker.
        await pump(want.read,
                   lambda pieces: state.workers.submit(af.write_many, pieces),
                   before=root.ensure_alive)
        # call, not run: abort must not close the fd under a finish or commit still
        # running for a client that has left.
        digest = await call(state.workers, functools.partial(
            af.finish, expect_size=want.size, expect_sha256=want.sha256,
            owner=params.owner, replaced=replaced))
        # The digest is not left in the cache: the container may rewrite the file
        # (as it could the temp file) within the rename's timestamp tick (digests.py).
        await call(state.workers, af.commit, params.overwrite)
        return {"path": path, "size": af.size, "sha256": digest}
    except OSError as exc:
        raise fs_status(exc, path) from exc
    finally:
        if af is not None:
            await settle(run(af.abort))
        await settle(run(_close_record, dir_fd, record))


def _close_record(fd: int, record: InflightRecord) -> None:
    os.close(fd)
    record.done()


def _undo_target(root: FsRoot, path: str, opened: tuple[int, str | None]) -> None:
    """Undo open_target_dir for a client that left while it ran."""
    fd, made = opened
    os.close(fd)
    remove_created_target(root, path, made)


async def upload_tar(state: CopyState, root: FsRoot, path: str, body: ByteStream,
                     content_length: int | None, params: UploadParams) -> dict[str, Any]:
    want = Expected(_counted(body, state, params), content_length, params)
    if want.size is not None:
        state.slots.check_size(want.size)
    run = state.workers.run
    limits = state.limits
    record = InflightRecord(limits.state_dir, root)
    try:
        target_fd, made = await call(state.workers, open_target_dir, root, path, record,
                                     undo=functools.partial(_undo_target, root, path))
    except BaseException as exc:  # a new target's record may exist already: close it
        await settle(run(record.done))
        if isinstance(exc, OSError):
            raise fs_status(exc, path) from exc
        raise
    ex = TarExtractor(root, record, target_fd, path, params, fresh=made)
    # The loop only receives and counts; parsing and extraction happen in workers
    # (untar.TarSink), a batch of about a MiB at a time.
    sink = TarSink(ex, root, limits, headers_only=params.sha256_headers)

    ok = False
    try:
        try:
            await pump(want.read,
                       lambda pieces: state.workers.submit(sink.feed_many, pieces),
                       before=root.ensure_alive)
            await call(state.workers, sink.finish)
        finally:
            await settle(run(sink.abort))
        if want.size is not None and sink.size != want.size:
            raise StatusError(400, f"received {sink.size} bytes, expected {want.size}")
        digest = sink.hash.hexdigest()
        want.check(digest, path)
        await call(state.workers, ex.commit)
        ok = True
        return {"path": path, "size": sink.size, "sha256": digest, "entries": sink.entries}
    except TarError as exc:
        raise StatusError(400, f"invalid tar: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StatusError(400, f"{path}: a tar entry's path crosses a symlink; refused "
                              "(tar entries are resolved without following symlinks)") from exc
        raise fs_status(exc, path) from exc
    finally:
        # One call: settle re-raises a cancellation once its step is done, which would
        # skip the steps after it (the fd and the record stayed open).
        await settle(run(_end_tar, ex, root, path, made, target_fd, record, ok))


def _end_tar(ex: TarExtractor, root: FsRoot, path: str, made: str | None, target_fd: int,
             record: InflightRecord, ok: bool) -> None:
    try:
        if not ok:
            try:
                ex.rollback()
            finally:
                remove_created_target(root, path, made)
    finally:
        try:
            ex.close()
        finally:
            _close_record(target_fd, record)
