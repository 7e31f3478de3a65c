"""Extract a directory's PAX tar stream without trusting any entry.

Entries land in a fresh private temp directory beside the destination, which is
renamed into place only once the stream ended with its ``AGGAPI.complete``
record; each entry is applied (or refused, on its own) by
:class:`aggapi.client.extractor.Extractor`, and symlinks are checked again once the
stream ended by :mod:`aggapi.client.linkcheck`. A broken or truncated stream fails
the whole copy and removes the temp dir; one a killed run left is removed by the next
download to the same destination (:mod:`aggapi.client.staletemp`).

The tree is made durable before the rename that publishes it by one syncfs of the
temp dir's file system (where the platform has it; else an fsync per file and
directory), not a journal commit per file; earlier syncfs calls during the transfer
(:mod:`aggapi.client.earlysync`) leave it only the tail to wait for.

The event loop only receives: each piece of the stream (what arrived, up to
READ_SIZE) goes to one worker-thread call that parses it and applies every entry it
completes. A tree of small files costs a hand-off per piece, not per file, and the
file system's work (most of a small file's cost) runs beside the loop's TLS
receiving with the GIL released.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from aggapi.client import staletemp
from aggapi.client.confine import current_umask
from aggapi.client.earlysync import EarlySync
from aggapi.client.errors import LocalError, TransferError
from aggapi.client.extractor import Extractor, ExtractResult
from aggapi.client.linkcheck import recheck_links
from aggapi.client.partial import fsync_dir
from aggapi.tar.stream import ByteStream, TarError, TarReader

# The most a worker is handed at once (and the memory a piece holds): what arrived
# while it applied the last piece, usually less.
READ_SIZE = 1 << 20
T = TypeVar("T")

__all__ = ["READ_SIZE", "ExtractResult", "Extractor", "extract_dir"]


def _exists(p: Path) -> bool:
    return os.path.lexists(p)


async def extract_dir(reader: TarReader, dest: Path,
                      on_bytes: Callable[[int], None] = lambda n: None) -> ExtractResult:
    """Extract ``reader`` (its stream, parsed by its parser) as the new directory
    ``dest`` (which must not exist)."""
    if _exists(dest):
        raise LocalError.from_message(f"{dest} already exists; refusing to merge a directory "
                                      "copy into it")
    # Locked while this run lives; those of killed runs are removed first.
    tmp, lock = await asyncio.to_thread(staletemp.claim, dest)
    ok = False
    try:
        ex = Extractor(tmp, current_umask(), reader.parser)
        try:
            early = EarlySync(ex.root)
            try:
                await _feed_all(ex, reader.stream, on_bytes, early)
            except TarError as exc:
                raise TransferError.from_message(f"directory stream: {exc}") from exc
            finally:
                await early.settle()
            if not ex.complete:
                raise TransferError.from_message(
                    "directory stream ended without its completion record (cut short)")
            if (owed := ex.digests.owed()) is not None:
                raise TransferError.from_message(
                    f"directory stream ended before the sha256 of {owed!r}")
            ex.result.verified = bool(ex.digests.required)
            # Walks of the whole tree: off the event loop (no hop without a link).
            if ex.links:
                await _in_worker(recheck_links, ex)
            try:
                await _in_worker(ex.finish_dirs)
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
        os.close(lock)


async def _feed_all(ex: Extractor, stream: ByteStream, on_bytes: Callable[[int], None],
                    early: EarlySync) -> None:
    """Hand the stream to the extractor piece by piece, up to the end-of-archive block.

    A read takes whatever has arrived, up to READ_SIZE (bounded memory): while the
    worker applies one piece, the loop keeps receiving the next, so a busy worker is
    handed bigger pieces and the hand-offs per file fall as the load rises."""
    # A body in our own buffers (aggapi.serve.bodyreceiver.ResponseBody) is handed over
    # as the views received, not joined.
    pieces = getattr(stream, "pieces", None)
    while not ex.parser.ended:
        try:
            data = await (pieces(READ_SIZE) if pieces is not None else stream.read(READ_SIZE))
        except Exception as exc:  # a broken connection: a truncated tar
            raise TarError("tar stream ended early") from exc
        if not data:  # raises: the stream ended before the archive did
            await _in_worker(ex.end_of_stream)
            return
        feed = ex.feed_pieces if pieces is not None else ex.feed
        if n := await _in_worker(feed, data):
            on_bytes(n)
            early.wrote(n)  # writeback starts during the transfer, not after it


async def _in_worker(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread. Cancelled, it still waits for the call to
    return before re-raising: the caller's cleanup closes the fds the call works on."""
    fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await fut
        raise

