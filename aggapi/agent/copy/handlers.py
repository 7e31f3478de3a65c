"""aiohttp handlers of the agent's /v1/copy endpoint (HEAD stat, GET download, POST upload).

Wire conventions (the aggapi apiserver relays them unchanged):

- ``X-Aggapi-Stat``: base64 of the JSON object {name, size, mode, mtime, uid,
  gid, linkTarget, type} of the requested path (not following its last
  component), on every successful HEAD and GET. ``mode`` is st_mode; ``type``
  one of file, dir, symlink, char, block, fifo, socket; ids as the container
  sees them.
- Regular file (GET): raw bytes, ``Content-Length``, ``Accept-Ranges: bytes``,
  ``ETag`` from (inode, size, mtime), and the sha256 of the *whole* file as
  ``X-Aggapi-Sha256: <hex>``, ``Digest: sha-256=<base64>`` (RFC 3230) and
  ``Repr-Digest: sha-256=:<base64>:`` (RFC 9530), also on 206 replies so a
  client verifies after resuming. The digest is computed before the first
  byte (a full read in a worker thread, abandoned within a chunk when the client
  leaves) and cached by (dev, inode, size, mtime, ctime) once the file cannot
  change without a new key (aggapi.agent.copy.digests), so a resume does not pay
  for it again. With ``digest=trailer`` (a range to the end, digest not cached) the
  file is instead hashed as it is sent, read once, and the body ends with the whole
  file's raw sha256 (32 bytes, in Content-Length; bytes before a range are hashed
  first), announced by ``X-Aggapi-Sha256: trailer``; the digest is then cached on the
  same terms. HEAD sends it when cached or when the file is within the size
  limit; every operation, HEAD included, holds a copy slot. ``Range: bytes=N-`` (or N-M,
  -K) gives 206 + Content-Range; ``If-Range`` with another ETag gives 200 and
  the whole file.
- Directory (GET): ``Content-Type: application/x-tar``, a PAX tar of its
  contents with names relative to it, each regular file's sha256 in its entry, or
  with ``digest=trailer`` in the entry after it, each file then read once
  (aggapi.tar.entrydigest); the closing "./" entry reports skipped entries (see
  aggapi.agent.copy.download).
- Symlink (GET): with ``symlink=keep`` an empty body, the stat header carrying
  linkTarget; without it 409 (as cp without -P: a link is not the file).
- Upload (POST): body = the file, or with format=tar a tar extracted into the
  directory ``path`` (created if only its last component is missing); optional
  sha256= (hex, or ``trailer``: the body's last 32 bytes are the raw sha256 of the
  bytes before them; for a tar also ``headers:<hex>`` or ``headers-trailer``, the
  headers digest of aggapi.tar.entrydigest), mode= (octal; the only way to set
  setuid/setgid), uid=, gid=, overwrite=true|false (default true). Reply: JSON {path, size, sha256}
  (+ entries for tar).
- Errors are metav1.Status (via aggapi.status); a failure after a download has
  started aborts the connection, so a cut stream never looks complete.

Authorization: the capability the auth middleware verified
(``request[aggapi.agent.auth.CAPABILITY]``) must be a copy capability for this
operation, naming the ``container`` and the ``path`` asked for. The upload
parameters must be those the capability vouches for; sha256 alone may come
from the query only (it restricts, never widens, what is written).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import stat as st_
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

from aggapi import wire
from aggapi.agent.auth import CAPABILITY
from aggapi.agent.copy import creds, tarwalk
from aggapi.agent.copy import download as dl
from aggapi.agent.copy.atomic import Owner
from aggapi.agent.copy.digests import Cancelled, Pending
from aggapi.agent.copy.fserrors import fs_status
from aggapi.agent.copy.fsroot import FsRoot, request_path
from aggapi.agent.copy.pace import PACE, MinRate, PacedBody, paced_write
from aggapi.agent.copy.ranges import etag, parse_range
from aggapi.agent.copy.settle import call, settle, wait_out
from aggapi.agent.copy.state import CopyState
from aggapi.agent.copy.upload import upload_file, upload_tar
from aggapi.agent.copy.uploadparams import UploadParams, strict_query
from aggapi.auth.capability import Capability
from aggapi.status import StatusError

log = logging.getLogger(__name__)

CHUNK = 1 << 20


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _capability(request: web.Request, *ops: str) -> Capability:
    cap = request.get(CAPABILITY)
    if cap is None:
        raise StatusError(401, "a capability token is required")
    if cap.operation not in ops:
        raise StatusError(403, f"capability is for {cap.operation}, not {ops[0]}")
    return cap


def _target(request: web.Request, cap: Capability) -> tuple[str, str]:
    """(container name, clean path), both as the capability names them."""
    strict_query(request.method, request.query)
    names = [c.name for c in cap.containers]
    container = request.query.get(wire.PARAM_CONTAINER) or (names[0] if len(names) == 1 else "")
    if not container:
        raise StatusError(400, "container is required")
    if container not in names:
        raise StatusError(403, f'capability does not cover container "{container}"')
    path = request_path(request.query.get(wire.PARAM_PATH))
    if cap.path is None or request_path(cap.path) != path:
        raise StatusError(403, f"capability does not cover path {path!r}")
    return container, path  # relative: resolved once the container is open


def _param(request: web.Request, cap: Capability, key: str) -> str | None:
    q = request.query.get(key)
    c = cap.params.get(key)
    if q is not None and c is not None and q != c:
        raise StatusError(403, f"{key}={q!r} differs from the capability's {c!r}")
    if q is not None and c is None and key not in wire.QUERY_ONLY_UPLOAD_PARAMS:
        raise StatusError(403, f"{key} is not authorized by the capability")
    return c if c is not None else q


def upload_params(request: web.Request, cap: Capability) -> UploadParams:
    raw = {k: _param(request, cap, k) for k in wire.UPLOAD_PARAMS}
    ow = (raw["overwrite"] or "true").lower()
    if ow not in ("true", "false", "1", "0"):
        raise StatusError(400, "overwrite must be true or false")
    mode = raw["mode"]
    if mode is not None and not re.fullmatch(r"0?[0-7]{1,4}", mode):
        raise StatusError(400, "mode must be octal, at most 07777")
    ids: dict[str, int | None] = {}
    for k in ("uid", "gid"):
        v = raw[k]
        if v is not None and (not v.isdigit() or int(v) > 0xFFFFFFFE):
            raise StatusError(400, f"{k} must be a number")
        ids[k] = int(v) if v is not None else None
    fmt = raw["format"] or "raw"
    if fmt not in ("raw", "tar"):
        raise StatusError(400, "format must be raw or tar")
    if fmt == "tar" and mode is not None:
        raise StatusError(400, "mode= applies to single files only")
    sha, trailer, headers = _sha256_claim(raw["sha256"], fmt == "tar")
    return UploadParams(
        overwrite=ow in ("true", "1"),
        owner=Owner(ids["uid"], ids["gid"], int(mode, 8) if mode else None,
                    keep_setid=mode is not None),
        sha256=sha, sha256_trailer=trailer, sha256_headers=headers, tar=fmt == "tar")


def _sha256_claim(value: str | None, tar: bool) -> tuple[str | None, bool, bool]:
    """sha256= as (hex up front or None, in a trailer, of the tar's headers only)."""
    if value is None:
        return None, False, False
    trailer = value in (wire.SHA256_TRAILER, wire.SHA256_HEADERS_TRAILER)
    headers = value == wire.SHA256_HEADERS_TRAILER \
        or value.startswith(wire.SHA256_HEADERS_PREFIX)
    if headers and not tar:
        raise StatusError(400, "a headers digest (sha256=headers...) applies to format=tar "
                          "only")
    hex_ = None if trailer else value.removeprefix(wire.SHA256_HEADERS_PREFIX)
    if hex_ is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", hex_):
        raise StatusError(400, f"{wire.SHA256_REFUSED}, {wire.SHA256_TRAILER!r}, "
                          f"{wire.SHA256_HEADERS_PREFIX!r} and 64 hex digits, or "
                          f"{wire.SHA256_HEADERS_TRAILER!r}")
    return hex_, trailer, headers


@dataclass(frozen=True)
class DownloadParams:
    # digest=trailer: each file's sha256 follows its data (wire.DIGEST_TRAILER).
    trailer: bool = False
    # digest given (trailer or entry): a directory's tar carries the AGGAPI.* records;
    # without it, a plain tar (aggapi.agent.copy.tarwalk.TarWalker.plain).
    records: bool = False
    # symlink=keep: a symlink at the path is sent as the link itself.
    keep_symlink: bool = False


def download_params(request: web.Request) -> DownloadParams:
    """The download's options, parsed before the container is looked at: a bad value
    is a 400 whatever the path holds."""
    digest = request.query.get(wire.PARAM_DIGEST)
    if digest is not None and digest not in (wire.DIGEST_TRAILER, wire.DIGEST_ENTRY):
        raise StatusError(400, f"{wire.PARAM_DIGEST} must be {wire.DIGEST_TRAILER} or "
                          f"{wire.DIGEST_ENTRY}")
    link = request.query.get(wire.PARAM_SYMLINK)
    if link is not None and link != wire.SYMLINK_KEEP:
        raise StatusError(400, f"{wire.PARAM_SYMLINK} must be {wire.SYMLINK_KEEP}")
    return DownloadParams(trailer=digest == wire.DIGEST_TRAILER, keep_symlink=link is not None,
                          records=digest is not None)


@asynccontextmanager
async def _container(state: CopyState, cap: Capability, name: str) -> AsyncIterator[FsRoot]:
    root = await state.resolver.resolve(cap.pod_uid, name)
    try:
        with creds.serving(root.creds):  # every worker call of this copy acts as its user
            yield root
    except StatusError as exc:
        if exc.code == 403 and root.as_user and root.who() not in exc.message:
            exc.message += f" (copies act as the container's user, {root.who()})"
        raise
    finally:
        root.close()


@asynccontextmanager
async def _lookup(state: CopyState, root: FsRoot, path: str) -> AsyncIterator[dl.Target]:
    """The path, opened without following its last component; closed on exit."""
    try:
        t = await call(state.workers, dl.lookup, root, path, undo=dl.Target.close)
    except OSError as exc:
        raise fs_status(exc, path) from exc
    try:
        yield t
    finally:
        await settle(state.workers.run(dl.Target.close, t))


def _stat_header(root: FsRoot, t: dl.Target) -> dict[str, str]:
    doc = json.dumps(dl.stat_dict(root, t), separators=(",", ":")).encode()
    return {wire.HEADER_STAT: _b64(doc)}


def _digest_headers(digest: str) -> dict[str, str]:
    """The whole file's sha256 in our header and the two standard ones (GET and HEAD)."""
    raw = bytes.fromhex(digest)
    return {wire.HEADER_SHA256: digest, wire.HEADER_DIGEST: f"sha-256={_b64(raw)}",
            wire.HEADER_REPR_DIGEST: f"sha-256=:{_b64(raw)}:"}


async def _digest(state: CopyState, fd: int) -> str:
    """The file's sha256, hashed in a worker; abandoned within a chunk if this task is
    cancelled (the client left), and only then does the caller close ``fd``."""
    cancel = threading.Event()
    fut = state.workers.submit(state.digests.digest, fd, cancel)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        cancel.set()
        await wait_out(fut)
        if not fut.cancelled():
            fut.exception()  # Cancelled, or the digest: nobody wants it now
        raise


async def _file_digest_headers(state: CopyState, t: dl.Target) -> dict[str, str]:
    """For HEAD on a regular file: the same digest headers GET sends, when the digest
    is cached or the file is within the size limit (hashing more would hold a worker
    for what GET would refuse anyway). A file GET would refuse (a pseudo file, no read
    permission) gets none: HEAD still answers the stat."""
    if not st_.S_ISREG(t.st.st_mode):
        return {}
    try:
        async with _opened(state, t, dl.open_regular) as fd:
            if t.st.st_size > state.limits.size_limit:
                cached = await state.workers.run(state.digests.cached, fd)
                return _digest_headers(cached) if cached is not None else {}
            return _digest_headers(await _digest(state, fd))
    except (StatusError, Cancelled):
        return {}


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


async def _write(request: web.Request, resp: web.StreamResponse, chunk: bytes) -> None:
    # Counted once handed to the transport: resp.write() then only waits for it to drain.
    request[SENT] = request.get(SENT, 0) + len(chunk)
    await paced_write(request, resp, chunk)  # cut if the client reads too slowly


def _abort(request: web.Request, why: str) -> ConnectionResetError:
    """Cut the connection: a truncated body must not look like a complete one."""
    log.warning("copy %s aborted: %s", request.path_qs, why)
    if request.transport is not None:
        request.transport.abort()
    return ConnectionResetError(why)


async def _send_file(request: web.Request, state: CopyState, root: FsRoot,
                     t: dl.Target, want_trailer: bool) -> web.StreamResponse:
    async with _opened(state, t, dl.open_regular) as fd:
        state.slots.check_size(t.st.st_size)
        size = t.st.st_size
        tag = etag(t.st)
        rng = parse_range(request.headers.get("Range"), size,
                          if_range=request.headers.get("If-Range"), current_etag=tag)
        first, last = rng if rng is not None else (0, size - 1)
        # digest=trailer: the file is hashed as it is sent (one read, no wait before
        # the head) unless its digest is cached, which then goes up front as always.
        # Only for a range that runs to the end: the trailer is the whole file's.
        trailer: Pending | None = None
        cached: str | None = None
        if want_trailer and last == size - 1:
            cached = await state.workers.run(state.digests.cached, fd)
            if cached is None:
                trailer = await state.workers.run(state.digests.start, fd)
        headers = {**_stat_header(root, t), "Accept-Ranges": "bytes", "ETag": tag,
                   "Content-Type": "application/octet-stream"}
        if trailer is None:  # (the cache was just asked: no second lookup)
            headers.update(_digest_headers(cached or await _digest(state, fd)))
        else:
            headers[wire.HEADER_SHA256] = wire.DIGEST_TRAILER
            await _hash_prefix(request, state, root, fd, first, trailer)
        if rng is not None:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        resp = web.StreamResponse(status=206 if rng is not None else 200, headers=headers)
        resp.content_length = last - first + 1 + (
            wire.SHA256_TRAILER_SIZE if trailer is not None else 0)
        await resp.prepare(request)
        request[BODY_SIZE] = resp.content_length
        await _stream_range(request, state, root, resp, fd, first, last + 1, trailer)
        if trailer is not None:
            await state.workers.run(state.digests.finish, fd, trailer)
            await _write(request, resp, trailer.digest())
        await resp.write_eof()
        return resp


async def _hash_prefix(request: web.Request, state: CopyState, root: FsRoot, fd: int,
                       end: int, trailer: Pending) -> None:
    """Hash the bytes before a resumed range (the client has them): a chunk per worker
    call, so a client that leaves frees the worker within a chunk."""
    off = 0
    while off < end:
        data = await call(state.workers, _read_hashed, fd, min(CHUNK, end - off), off,
                          trailer)
        if not data:
            raise StatusError(409, "the file shrank while being read; ask again")
        off += len(data)
        if not root.alive():
            raise StatusError(409, "container exited during the download")


def _close_fd(fd: int) -> None:
    os.close(fd)


@asynccontextmanager
async def _opened(state: CopyState, t: dl.Target,
                  opener: Callable[[dl.Target], int]) -> AsyncIterator[int]:
    """The fd ``opener`` makes for ``t`` (in a worker); closed in a worker on exit, also
    when the client leaves while it is being opened or used."""
    try:
        fd = await call(state.workers, opener, t, undo=_close_fd)
    except OSError as exc:
        raise fs_status(exc, t.path) from exc
    try:
        yield fd
    finally:
        await settle(state.workers.run(_close_fd, fd))


def _read_hashed(fd: int, n: int, off: int, pending: Pending) -> bytes:
    data = os.pread(fd, n, off)
    pending.update(data)  # in the reading worker, while the chunk is in cache
    return data


async def _stream_range(request: web.Request, state: CopyState, root: FsRoot,
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
        return state.workers.submit(_read_hashed, fd, n, at, trailer)

    try:
        while off < end:
            if nxt is None:
                nxt = read(off)
            cur = await asyncio.shield(nxt)
            nxt = None
            if not cur:
                raise _abort(request, "file shrank while being sent")
            off += len(cur)
            if off < end:
                nxt = read(off)
            if not root.alive():
                raise _abort(request, "container exited during the download")
            await _write(request, resp, cur)
    finally:
        if nxt is not None:
            await wait_out(nxt)


async def _send_dir(request: web.Request, state: CopyState, root: FsRoot,
                    t: dl.Target, trailing: bool, *, plain: bool = False
                    ) -> web.StreamResponse:
    async with _opened(state, t, dl.open_dir) as dfd:
        await call(state.workers, tarwalk.measure, dfd, state.limits)
        walker = tarwalk.TarWalker(root, dfd, state.limits, trailing=trailing, plain=plain)
        gen = walker.chunks()
        try:
            resp = web.StreamResponse(status=200, headers={
                **_stat_header(root, t), "Content-Type": "application/x-tar"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            while True:
                try:
                    # call: a cancelled step is waited out before gen.close and dfd's close
                    chunk = await call(state.workers, next, gen, None)
                except (OSError, StatusError) as exc:
                    raise _abort(request, f"directory walk failed: {exc}") from exc
                if chunk is None:
                    break
                if not root.alive():
                    raise _abort(request, "container exited during the download")
                if chunk:  # empty: a step of hashing a big file (download.TarWalker)
                    await _write(request, resp, chunk)
            await resp.write_eof()
            return resp
        finally:
            # Closes the fds of the directories and file the walk is in.
            await settle(state.workers.run(gen.close))


def _symlink_wanted(params: DownloadParams, path: str, link: str | None) -> None:
    """A download of a symlink sends the link only when asked to (symlink=keep)."""
    if params.keep_symlink:
        return
    to = f" to {link!r}" if link else ""
    raise StatusError(409, f"{path}: is a symbolic link{to}; not followed. Ask for the link "
                      f"itself with {wire.PARAM_SYMLINK}={wire.SYMLINK_KEEP} (kubectl ncp -P)")


class CopyHandlers:
    """The /v1/copy routes, bound to the copy engine's state at construction."""

    def __init__(self, state: CopyState) -> None:
        self.state = state

    async def stat(self, request: web.Request) -> web.StreamResponse:
        cap = _capability(request, wire.OP_COPY_STAT, wire.OP_COPY_DOWNLOAD)
        container, path = _target(request, cap)
        # A slot like any copy: HEAD may hash a file (up to the size limit).
        with self.state.slots.slot(cap.pod_uid):
            async with _container(self.state, cap, container) as root:
                path = await self.state.workers.run(root.absolute, path)
                async with _lookup(self.state, root, path) as t:
                    return web.Response(status=200, headers={
                        **_stat_header(root, t),
                        **await _file_digest_headers(self.state, t)})

    async def download(self, request: web.Request) -> web.StreamResponse:
        cap = _capability(request, wire.OP_COPY_DOWNLOAD)
        state = self.state
        container, path = _target(request, cap)
        params = download_params(request)
        request[PACE] = MinRate(state.limits.min_rate, state.limits.rate_window)
        with state.slots.slot(cap.pod_uid, cap.pod_namespace):
            async with _container(state, cap, container) as root:
                path = await state.workers.run(root.absolute, path)
                async with _lookup(state, root, path) as t:
                    if st_.S_ISDIR(t.st.st_mode):
                        return await _send_dir(request, state, root, t, params.trailer,
                                               plain=not params.records)
                    if st_.S_ISLNK(t.st.st_mode):
                        _symlink_wanted(params, path, t.link)
                        return web.Response(status=200, headers=_stat_header(root, t))
                    return await _send_file(request, state, root, t, params.trailer)

    async def upload(self, request: web.Request) -> web.StreamResponse:
        cap = _capability(request, wire.OP_COPY_UPLOAD)
        state = self.state
        container, path = _target(request, cap)
        params = upload_params(request, cap)
        if request.content_length is not None:  # the data's: a sha256 trailer is not
            state.slots.check_size(request.content_length
                                   - (wire.SHA256_TRAILER_SIZE if params.sha256_trailer else 0))
        # A client that stops sending, or trickles, is cut off: the slot and the temp
        # files go with it.
        body = PacedBody(request.content, state.limits.body_idle_timeout,
                         MinRate(state.limits.min_rate, state.limits.rate_window))
        with state.slots.slot(cap.pod_uid, cap.pod_namespace):
            async with _container(state, cap, container) as root:
                path = await state.workers.run(root.absolute, path)
                send = upload_tar if params.tar else upload_file
                try:
                    result = await send(state, root, path, body, request.content_length,
                                        params)
                except StatusError:
                    if body.stalled is not None:  # the tar parser reports it as a short tar
                        raise body.stalled from None
                    raise
        return web.json_response(result)
