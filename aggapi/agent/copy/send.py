"""Download bodies: a regular file (a range of it, hashed as sent with
digest=trailer) and a directory's tar, read one chunk ahead in workers and written
at the client's pace (aggapi.agent.copy.pace)."""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from aggapi import wire
from aggapi.agent.copy import download as dl
from aggapi.agent.copy import tarwalk
from aggapi.agent.copy.digests import Pending
from aggapi.agent.copy.fds import opened
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.heads import digest, digest_headers, stat_header
from aggapi.agent.copy.pace import paced_write
from aggapi.agent.copy.ranges import etag, parse_range
from aggapi.agent.copy.settle import call, settle, wait_out
from aggapi.agent.copy.state import CopyState
from aggapi.status import StatusError

log = logging.getLogger(__name__)

CHUNK = 1 << 20


# Body bytes a download has handed to the transport so far, and its Content-Length when
# known (a file; a directory's tar has none), for the agent's copy metrics.
SENT: web.RequestKey[int] = web.RequestKey("copy_bytes_sent", int)
BODY_SIZE: web.RequestKey[int] = web.RequestKey("copy_body_size", int)


def bytes_sent(request: web.Request) -> tuple[int, bool]:
    """The body bytes a download handed over, and whether that is its whole body: a
    client may hang up the moment its Content-Length is in, cancelling the handler
    while the last write still drains, and that download still succeeded."""
    sent = request.get(SENT, 0)
    return sent, BODY_SIZE in request and sent >= request[BODY_SIZE]


async def write(request: web.Request, resp: web.StreamResponse, chunk: bytes) -> None:
    # Counted once handed to the transport: resp.write() then only waits for it to drain.
    request[SENT] = request.get(SENT, 0) + len(chunk)
    await paced_write(request, resp, chunk)  # cut if the client reads too slowly


def abort(request: web.Request, why: str) -> ConnectionResetError:
    """Cut the connection: a truncated body must not look like a complete one."""
    log.warning("copy %s aborted: %s", request.path_qs, why)
    if request.transport is not None:
        request.transport.abort()
    return ConnectionResetError(why)


async def send_file(request: web.Request, state: CopyState, root: FsRoot,
                    t: dl.Target, want_trailer: bool, body: bool = True) -> web.StreamResponse:
    """A regular file's download; without ``body`` (HEAD) the same status and headers
    with nothing sent, and nothing hashed for a digest that would trail."""
    async with opened(state, t, dl.open_regular) as fd:
        state.slots.check_size(t.st.st_size)
        # The size seen at lookup is the download's: its Content-Length, the bytes
        # sent and hashed, whatever the file does after (digests.DigestCache.digest).
        size = t.st.st_size
        tag = etag(t.st)
        # HEAD ignores Range: GET is the only method range handling is defined for
        # (RFC 9110 section 14.2).
        rng = parse_range(request.headers.get("Range"), size,
                          if_range=request.headers.get("If-Range"),
                          current_etag=tag) if body else None
        first, last = rng if rng is not None else (0, size - 1)
        # digest=trailer: the file is hashed as it is sent (one read, no wait before
        # the head) unless its digest is cached, which then goes up front as always.
        # Only for a range that runs to the end: the trailer is the whole file's.
        trailing = False
        cached: str | None = None
        if want_trailer and last == size - 1:
            cached = await state.workers.run(state.digests.cached, fd, size)
            trailing = cached is None
        headers = {**stat_header(root, t), "Accept-Ranges": "bytes", "ETag": tag,
                   "Content-Type": "application/octet-stream"}
        if not trailing:  # (the cache was just asked: no second lookup)
            headers.update(digest_headers(cached or await digest(state, fd, size)))
        else:
            headers[wire.HEADER_SHA256] = wire.DIGEST_TRAILER
        if rng is not None:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        length = last - first + 1 + (wire.SHA256_TRAILER_SIZE if trailing else 0)
        if not body:
            return web.Response(status=200, headers={**headers,
                                                     "Content-Length": str(length)})
        trailer: Pending | None = None
        if trailing:
            trailer = await state.workers.run(state.digests.start, fd)
            await hash_prefix(request, state, root, fd, first, trailer)
        resp = web.StreamResponse(status=206 if rng is not None else 200, headers=headers)
        resp.content_length = length
        await resp.prepare(request)
        request[BODY_SIZE] = length
        await stream_range(request, state, root, resp, fd, first, last + 1, trailer)
        if trailer is not None:
            await state.workers.run(state.digests.finish, fd, trailer)
            await write(request, resp, trailer.digest())
        await resp.write_eof()
        return resp


async def hash_prefix(request: web.Request, state: CopyState, root: FsRoot, fd: int,
                       end: int, trailer: Pending) -> None:
    """Hash the bytes before a resumed range (the client has them): a chunk per worker
    call, so a client that leaves frees the worker within a chunk."""
    off = 0
    while off < end:
        data = await call(state.workers, read_hashed, fd, min(CHUNK, end - off), off,
                          trailer)
        if not data:
            raise StatusError(409, "the file shrank while being read; ask again")
        off += len(data)
        if not root.alive():
            raise StatusError(409, "container exited during the download")


def read_hashed(fd: int, n: int, off: int, pending: Pending) -> bytes:
    data = os.pread(fd, n, off)
    pending.update(data)  # in the reading worker, while the chunk is in cache
    return data


async def stream_range(request: web.Request, state: CopyState, root: FsRoot,
                        resp: web.StreamResponse, fd: int, start: int, end: int,
                        trailer: Pending | None = None) -> None:
    """Send [start, end) reading one chunk ahead in a worker: two chunks in memory;
    with ``trailer``, each chunk is hashed by the worker that read it (one read in
    flight at a time, so in order). On the way out (the client left) the read in
    flight is waited for: ``fd`` is closed after this returns and must not be closed
    under a worker's pread."""
    off = start
    nxt: asyncio.Future[bytes] | None = None

    def read(at: int) -> asyncio.Future[bytes]:
        n = min(CHUNK, end - at)
        if trailer is None:
            return state.workers.submit(os.pread, fd, n, at)
        return state.workers.submit(read_hashed, fd, n, at, trailer)

    try:
        while off < end:
            if nxt is None:
                nxt = read(off)
            cur = await asyncio.shield(nxt)
            nxt = None
            if not cur:
                raise abort(request, "file shrank while being sent")
            off += len(cur)
            if off < end:
                nxt = read(off)
            if not root.alive():
                raise abort(request, "container exited during the download")
            await write(request, resp, cur)
    finally:
        if nxt is not None:
            await wait_out(nxt)


async def send_dir(request: web.Request, state: CopyState, root: FsRoot,
                   t: dl.Target, trailing: bool, body: bool = True, *, plain: bool = False
                   ) -> web.StreamResponse:
    """A directory's tar (``plain``: without the AGGAPI.* records and the ``./``
    entry); without ``body`` (HEAD) its head, after the same checks."""
    async with opened(state, t, dl.open_dir) as dfd:
        await call(state.workers, tarwalk.measure, dfd, state.limits)
        if not body:
            return web.Response(status=200, headers={
                **stat_header(root, t), "Content-Type": "application/x-tar"})
        walker = tarwalk.TarWalker(root, dfd, state.limits, trailing=trailing, plain=plain)
        gen = walker.chunks()
        nxt: asyncio.Future[bytes | None] | None = None
        try:
            resp = web.StreamResponse(status=200, headers={
                **stat_header(root, t), "Content-Type": "application/x-tar"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            # One walk step ahead, as a file's range is read one chunk ahead: the next
            # MiB of the tar is built in a worker while this one is written, so the
            # walk's file system work overlaps the loop's TLS and the client's pace (two
            # chunks in memory at most).
            nxt = state.workers.submit(next, gen, None)
            while True:
                try:
                    # shield: a cancelled step is waited out (finally) before gen.close
                    chunk = await asyncio.shield(nxt)
                except (OSError, StatusError) as exc:
                    raise abort(request, f"directory walk failed: {exc}") from exc
                nxt = None
                if chunk is None:
                    break
                nxt = state.workers.submit(next, gen, None)
                if not root.alive():
                    raise abort(request, "container exited during the download")
                if chunk:  # empty: a step of hashing a big file (tarwalk.TarWalker)
                    await write(request, resp, chunk)
            await resp.write_eof()
            return resp
        finally:
            if nxt is not None:  # the generator cannot close while a step runs
                await wait_out(nxt)
            # Closes the fds of the directories and file the walk is in.
            await settle(state.workers.run(gen.close))
