"""pods/copy (KEP-4582) from the client side: stat, download, upload.

Every request goes to the ``/watch/`` form of the path, which kube-apiserver
treats as long-running, so a large copy is not cut at 60 s (RBAC there checks
verb ``watch``; aggapi itself checks get/create on pods/copy).

Downloads verify the whole file's sha256 and resume with ``Range``/``If-Range``
after a cut connection, and across runs through the partial file kept beside the
destination. They ask for the digest after the data (``digest=trailer``: the agent
reads the file once); an agent that predates it sends ``X-Aggapi-Sha256`` up front.
Directories arrive as a PAX tar and are extracted by :mod:`aggapi.client.extract`.
Uploads carry the sha256 (a file's after its bytes, hashed as they are sent; a tar's,
each file's data in its own entry and the rest as the headers digest of
:mod:`aggapi.tar.entrydigest`) so the server refuses to commit anything else, and
compare the server's reply.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from aggapi import wire
from aggapi.client.confine import link_stays_inside
from aggapi.client.connection import Connection, subresource_path
from aggapi.client.errors import (
    AggapiError,
    BadRequest,
    IntegrityError,
    LocalError,
    RangeNotSatisfiable,
    TransferError,
    UnsafeArchive,
)
from aggapi.client.extract import extract_dir
from aggapi.client.packtar import Listing, list_tree, tar_size, tar_stream
from aggapi.client.partial import Origin, PartialFile
from aggapi.client.retry import CATCH, Backoff, wait_or_raise
from aggapi.fs.pump import pump
from aggapi.serve.bodyreceiver import ResponseBody
from aggapi.tar.stream import TarReader

CHUNK = 1 << 20
# For an agent that wants a directory's digest before its tar, a tar up to this size
# is built once and held for sending (and every retry); a bigger one is built again
# for sending, in bounded memory. Agents that take a digest trailer get every tar
# built as it is sent.
READ_ONCE_MAX = 64 << 20


class Progress(Protocol):
    def start(self, total: int | None, done: int = 0) -> None: ...

    def advance(self, n: int) -> None: ...


class RateLimit:
    """Pace a transfer to ``rate`` bytes/s (curl's --limit-rate), by sleeping."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.t0 = time.monotonic()
        self.sent = 0

    async def pace(self, n: int) -> None:
        if not self.rate:
            return
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.t0)
        if ahead > 0:
            await asyncio.sleep(ahead)


class NoProgress:
    def start(self, total: int | None, done: int = 0) -> None:
        pass

    def advance(self, n: int) -> None:
        pass


@dataclass(frozen=True)
class RemotePath:
    """``[namespace/]pod:/path`` in container ``container`` (None: the pod's only one)."""

    namespace: str
    pod: str
    path: str
    container: str | None = None

    def source(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container or ''}:{self.path}"

    def url(self) -> str:
        return subresource_path(self.namespace, self.pod, "copy", watch=True)

    def params(self, **extra: str) -> list[tuple[str, str]]:
        out = [("path", self.path)]
        if self.container:
            out.insert(0, ("container", self.container))
        return out + list(extra.items())


@dataclass
class Result:
    path: str
    kind: str  # file, dir or symlink
    size: int = 0
    sha256: str = ""
    resumed_from: int = 0
    retries: int = 0
    entries: int = 0
    skipped: list[Any] = field(default_factory=list)  # entries the server left out
    refused: list[str] = field(default_factory=list)  # entries not created here, and why
    verified: bool = True  # a directory's files each checked against their sha256


def decode_stat(value: str | None) -> dict[str, Any]:
    if not value:
        return {}
    try:
        doc = json.loads(base64.b64decode(value))
    except (ValueError, binascii.Error):
        return {}
    return doc if isinstance(doc, dict) else {}


def response_sha256(headers: Any) -> str | None:
    """The whole file's sha256 (hex) from X-Aggapi-Sha256, Repr-Digest or Digest."""
    sha = headers.get(wire.HEADER_SHA256)
    if sha and re.fullmatch(r"[0-9a-fA-F]{64}", sha):
        return str(sha).lower()
    for name, pat in ((wire.HEADER_REPR_DIGEST, r"sha-256=:([^:]+):"),
                      (wire.HEADER_DIGEST, r"sha-256=([^,\s]+)")):
        m = re.search(pat, headers.get(name, ""))
        if m:
            with contextlib.suppress(ValueError, binascii.Error):
                raw = base64.b64decode(m.group(1), validate=True)
                if len(raw) == 32:
                    return raw.hex()
    return None


def _content_range(value: str | None) -> tuple[int, int, int] | None:
    m = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", (value or "").strip())
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


# A stat is of the path itself (a symlink as the link), and asks for no digest up front:
# HEAD answers as GET would, so without these it would refuse a symlink and hash a file.
STAT_CHOICES = {wire.PARAM_SYMLINK: wire.SYMLINK_KEEP, wire.PARAM_DIGEST: wire.DIGEST_TRAILER}


async def stat_remote(conn: Connection, rp: RemotePath) -> dict[str, Any]:
    """The X-Aggapi-Stat object of the path (NotFound if it does not exist)."""
    try:
        async with conn.request("HEAD", rp.url(), params=rp.params(**STAT_CHOICES)) as resp:
            return decode_stat(resp.headers.get(wire.HEADER_STAT))
    except AggapiError as exc:
        if not exc.bodiless:
            raise
    # A HEAD reply carries no Status: ask with GET for the server's message (on the
    # unlikely success the body is dropped unread, the headers are the same).
    async with conn.request("GET", rp.url(), params=rp.params(**STAT_CHOICES)) as resp:
        return decode_stat(resp.headers.get(wire.HEADER_STAT))


async def download(conn: Connection, rp: RemotePath, dest: Path, *,
                   progress: Progress | None = None, backoff: Backoff | None = None,
                   rate_limit: float | None = None, preserve: bool = True,
                   keep_symlink: bool = False) -> Result:
    """Copy ``rp`` to the local ``dest`` (a file, a directory tree or a symlink);
    ``preserve=False``: a file keeps the local default mode, not the container's.
    ``keep_symlink`` (cp -P): a path that is a symlink becomes a local symlink;
    otherwise it is refused, as a link is not the file (the server refuses it too)."""
    progress = progress or NoProgress()
    backoff = backoff or Backoff()
    partial = PartialFile(dest)
    origin = partial.resumable(rp.source())
    resumed_from = partial.size if origin else 0
    retries = 0
    limit = RateLimit(rate_limit)
    try:
        while True:
            headers = {}
            if origin is not None and partial.size:
                headers = {"Range": f"bytes={partial.size}-", "If-Range": origin.etag}
            try:
                # digest=trailer: a file's sha256 after its data (one read on the agent);
                # an agent that predates it sends the digest up front, as before.
                query = rp.params(**{wire.PARAM_DIGEST: wire.DIGEST_TRAILER},
                                  **({wire.PARAM_SYMLINK: wire.SYMLINK_KEEP}
                                     if keep_symlink else {}))
                async with conn.request("GET", rp.url(), params=query,
                                        headers=headers) as resp:
                    st = decode_stat(resp.headers.get(wire.HEADER_STAT))
                    ctype = resp.headers.get("Content-Type", "")
                    if ctype.startswith("application/x-tar") or st.get("type") == "dir":
                        partial.discard()
                        return await _receive_dir(resp, dest, st, progress)
                    if st.get("type") == "symlink":
                        partial.discard()
                        if not keep_symlink:  # whatever the server did with the query
                            raise UnsafeArchive.from_message(
                                f"{rp.path} is a symbolic link to "
                                f"{st.get('linkTarget')!r}; not copied (-P copies the link)")
                        return _make_symlink(dest, st)
                    origin, want = _check_origin(resp, rp, partial, origin, st)
                    progress.start(origin.size, partial.size)
                    tail = await _receive_file(resp, partial, progress, backoff, limit,
                                               trailer=want is None)
                    if partial.size != origin.size:
                        raise TransferError.from_message(
                            f"download ended at {partial.size} of {origin.size} bytes")
                want = want or tail.hex()  # the trailer: the whole file's sha256
                got = partial.hash.hexdigest()
                if got != want:
                    partial.discard()
                    raise IntegrityError.from_message(
                        f"sha256 mismatch for {rp.path}: got {got}, server says {want}"
                        "; nothing was written")
                mode = st.get("mode") if isinstance(st.get("mode"), int) else None
                # Not preserved: what a newly created file gets (0666 minus the umask).
                partial.commit(mode if preserve else 0o666)
                return Result(str(dest), "file", origin.size, got, resumed_from, retries)
            except RangeNotSatisfiable:
                # The partial file is longer than the file now is: start over.
                if origin is None:
                    raise
                partial.discard()
                origin = None
            except CATCH as exc:
                if isinstance(exc, IntegrityError):
                    raise
                await wait_or_raise(backoff, exc)
                retries += 1
    finally:
        partial.close()


async def _receive_file(resp: aiohttp.ClientResponse, partial: PartialFile,
                        progress: Progress, backoff: Backoff, limit: RateLimit, *,
                        trailer: bool = False) -> bytes:
    """Receive the body into ``partial``; with ``trailer``, its last 32 bytes are the
    sha256 and are returned, not written (the checked Content-Length holds them)."""
    # Decrypted straight into buffers of our own (a file has a Content-Length), which
    # the writer thread writes and hashes as they are.
    body = ResponseBody(resp)
    left = (resp.content_length or 0) - wire.SHA256_TRAILER_SIZE if trailer else -1
    tail = bytearray()  # never more than the trailer: split off by length

    async def read(n: int) -> bytes | memoryview:
        nonlocal left
        while True:
            piece = await body.next_piece()
            data = piece if left < 0 or len(piece) <= left else piece[:left]
            if len(data) < len(piece):
                tail.extend(piece[len(data):])
                if len(tail) > wire.SHA256_TRAILER_SIZE:  # the body's length forbids it
                    raise TransferError.from_message("the download ran past its trailer")
            if left >= 0:
                left -= len(data)
            if data or not piece:  # data, or the body's end; else trailer only: read on
                break
        if data:
            progress.advance(len(data))
            backoff.progressed()
            await limit.pace(len(data))
        return data

    loop = asyncio.get_running_loop()
    try:
        await pump(read, lambda pieces: loop.run_in_executor(None, partial.write_many, pieces),
                   keep_received=True)
    finally:
        if body.receiver is not None:
            resp.close()  # its connection is ours now: not reusable
    return bytes(tail)


def _check_origin(resp: aiohttp.ClientResponse, rp: RemotePath, partial: PartialFile,
                  origin: Origin | None, st: dict[str, Any]) -> tuple[Origin, str | None]:
    """The file's origin, and its sha256 from the head (None: it comes after the data,
    digest=trailer, and the Content-Length counts it)."""
    sha = response_sha256(resp.headers)
    trailer = resp.headers.get(wire.HEADER_SHA256) == wire.DIGEST_TRAILER
    if sha is None and not trailer:
        raise TransferError.from_message("the server sent no sha256 for the file; refusing "
                                         "an unverifiable download")
    length = resp.content_length
    if length is None and (trailer or resp.status != 206):
        raise TransferError.from_message("the server sent no Content-Length for the file")
    data = (length or 0) - (wire.SHA256_TRAILER_SIZE if trailer else 0)
    etag = resp.headers.get("ETag", "")
    if resp.status == 206:
        cr = _content_range(resp.headers.get("Content-Range"))
        if (origin is None or cr is None or cr[0] != partial.size or cr[2] != origin.size
                or (sha is not None and origin.sha256 and sha != origin.sha256)):
            raise TransferError.from_message("the server's partial reply does not continue "
                                             "the bytes already here")
        if trailer and (cr[1] != cr[2] - 1 or data != cr[1] - cr[0] + 1):
            raise TransferError.from_message("the server's partial reply is not framed as "
                                             "its range and a sha256 trailer")
        return origin, sha
    size = st.get("size")
    if data < 0 or (trailer and isinstance(size, int) and size != data):
        raise TransferError.from_message(f"the server's reply of {length} bytes is not "
                                         f"framed as a file of {size} and a sha256 trailer")
    fresh = Origin(rp.source(), etag, data, sha or "")
    partial.start(fresh)
    return fresh, sha


async def _receive_dir(resp: aiohttp.ClientResponse, dest: Path, st: dict[str, Any],
                       progress: Progress) -> Result:
    progress.start(None)
    res = await extract_dir(TarReader(resp.content), dest, progress.advance)
    return Result(res.path, "dir", res.bytes, "", entries=res.entries, skipped=res.skipped,
                  refused=res.refused, verified=res.verified)


def _make_symlink(dest: Path, st: dict[str, Any]) -> Result:
    target = st.get("linkTarget")
    if not isinstance(target, str) or not target:
        raise TransferError.from_message("symlink without a target")
    # The container names the target: a link to /root/.kube/config (or ../../x) would
    # turn "the downloaded file" into one of the user's own files.
    if not link_stays_inside(dest.parent, [], target):
        raise UnsafeArchive.from_message(
            f"refusing to create symlink {dest} -> {target!r}: it points outside "
            f"{dest.parent}")
    tmp = dest.with_name(f".{dest.name}.ncp-link")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, dest)
    return Result(str(dest), "symlink")


# --- uploads ---------------------------------------------------------------------------

def _sha256_fd(fd: int, size: int) -> str:
    h = hashlib.sha256()
    off = 0
    while off < size and (chunk := os.pread(fd, min(CHUNK, size - off), off)):
        h.update(chunk)
        off += len(chunk)
    return h.hexdigest()


def _symlink_refused(src: Path) -> AggapiError:
    return LocalError.from_message(
        f"{src} is a symbolic link; not followed (-L uploads what it points to)")


def _refuse_symlink(src: Path) -> None:
    if src.is_symlink():
        raise _symlink_refused(src)


def open_source(src: Path, *, follow_links: bool = False) -> tuple[int, os.stat_result]:
    """An fd of the regular file ``src`` and its fstat; its last component is opened
    with O_NOFOLLOW unless ``follow_links``: a symlink (one a download may have
    planted: app.conf -> .ssh/id_ed25519) is refused, not uploaded as its target."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY  # a FIFO never blocks
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(src, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise _symlink_refused(src) from exc
        raise LocalError.from_message(f"{src}: {exc.strerror}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise LocalError.from_message(f"{src} is not a regular file")
    return fd, st


async def _post(conn: Connection, rp: RemotePath, params: list[tuple[str, str]],
                headers: dict[str, str], body: Any, backoff: Backoff) -> tuple[dict[str, Any], int]:
    retries = 0
    while True:
        try:
            async with conn.request("POST", rp.url(), params=params, headers=headers,
                                    body=body) as resp:
                reply = await resp.json(content_type=None)
                if not isinstance(reply, dict):
                    raise TransferError.from_message("upload reply is not an object")
                return reply, retries
        except CATCH as exc:
            # Uploads are atomic on the server: sending again after a failure is safe.
            await wait_or_raise(backoff, exc)
            retries += 1


async def upload_file(conn: Connection, src: Path, rp: RemotePath, *, overwrite: bool = True,
                      mode: int | None = None, progress: Progress | None = None,
                      backoff: Backoff | None = None, rate_limit: float | None = None,
                      follow_links: bool = False) -> Result:
    """Upload the regular file ``src``; a symlink is refused unless ``follow_links``
    (-L). One fd, opened once, is hashed as it is sent (every retry reads it again)."""
    fd, st = open_source(src, follow_links=follow_links)
    size = st.st_size

    async def chunks(h: Hasher | None) -> AsyncIterator[bytes]:
        # A MiB at a time, encrypted right after it is read, while it is in the CPU
        # cache: reading a few MiB ahead per thread hand-over measured 0.3 CPU-s/GiB
        # more (bench_copy --ncp, 3 rounds). Never more than the size sent as
        # Content-Length, whatever the file does meanwhile.
        off = 0
        while off < size:
            chunk = await asyncio.to_thread(_read, fd, min(CHUNK, size - off), off, h)
            if not chunk:
                raise LocalError.from_message(f"the file shrank to {off} bytes while it "
                                              f"was sent ({size} at the start)")
            off += len(chunk)
            yield chunk

    params = rp.params(overwrite="true" if overwrite else "false")
    if mode is not None:
        params.append(("mode", f"{mode:o}"))
    try:
        reply, retries, sha = await _one_pass_or_two(
            functools.partial(_send, conn, rp, params, "application/octet-stream", size,
                              chunks, progress or NoProgress(), backoff or Backoff(),
                              rate_limit),
            lambda: asyncio.to_thread(_sha256_fd, fd, size))
    finally:
        os.close(fd)
    if reply.get("size") != size:
        raise IntegrityError.from_message(
            f"the server stored {reply.get('size')} bytes, sent {size} (sha256 {sha})")
    return Result(str(reply.get("path") or rp.path), "file", size, sha, retries=retries)


Hasher = Any  # hashlib's sha256 object (its type is private)
Chunks = Callable[[Hasher | None], AsyncIterator[bytes]]
Sent = tuple[dict[str, Any], int, str]  # the server's reply, retries, the sha256 sent


async def _one_pass_or_two(send: Callable[[str | None], Awaitable[Sent]],
                           digest: Callable[[], Awaitable[str]]) -> Sent:
    """One pass: hashed while sent, the digest after the bytes (sha256=trailer). An
    agent that predates the trailer refuses it up front; then a first pass hashes and
    the digest goes in the query."""
    try:
        return await send(None)
    except BadRequest as exc:
        _raise_unless_refused(exc)
    return await send(await digest())


def _raise_unless_refused(exc: BadRequest) -> None:
    """Re-raise ``exc`` unless it is an agent refusing a sha256 form it predates (which
    it answers before it writes anything)."""
    if wire.SHA256_REFUSED not in str(exc):
        raise exc


def _read(fd: int, n: int, off: int, h: Hasher | None) -> bytes:
    chunk = os.pread(fd, n, off)
    if h is not None:
        h.update(chunk)  # in the reading thread: hashlib lets go of the GIL
    return chunk


async def _send(conn: Connection, rp: RemotePath, params: list[tuple[str, str]],
                content_type: str, size: int, chunks: Chunks, progress: Progress,
                backoff: Backoff, rate_limit: float | None, sha: str | None, *,
                headers: bool = False) -> Sent:
    """POST ``size`` bytes from ``chunks`` (again for every retry) under the sha256
    ``sha``, or with ``sha`` None hashed as they go (by ``chunks``) and the digest sent
    after them; the server's reply must name the same sha256. ``headers``: the digest is
    a tar's headers digest (aggapi.tar.entrydigest), and ``chunks`` hashes that."""
    sent = sha

    async def body() -> AsyncIterator[bytes]:
        nonlocal sent
        progress.start(size)
        limit = RateLimit(rate_limit)
        h = hashlib.sha256() if sha is None else None
        async for chunk in chunks(h):
            progress.advance(len(chunk))
            yield chunk
            await limit.pace(len(chunk))
        if h is not None:
            sent = h.hexdigest()  # of this attempt's bytes
            yield h.digest()

    length = size if sha is not None else size + wire.SHA256_TRAILER_SIZE
    if headers:
        claim = wire.SHA256_HEADERS_PREFIX + sha if sha else wire.SHA256_HEADERS_TRAILER
    else:
        claim = sha or wire.SHA256_TRAILER
    reply, retries = await _post(conn, rp, [*params, ("sha256", claim)],
                                 {"Content-Type": content_type, "Content-Length": str(length)},
                                 body, backoff)
    if reply.get("sha256") != sent:
        raise IntegrityError.from_message(
            f"the server received sha256 {reply.get('sha256')}, sent {sent}")
    return reply, retries, str(sent)


async def _replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@dataclass
class PackedDir:
    """What a directory upload needs before its request, which needs no connection, so
    it can run while the connection is set up: the listing and the tar's size. The tar
    itself is built as it is sent; only for an agent that wants the digest first is a
    tar of up to READ_ONCE_MAX bytes built before (``kept``, sent again on a retry)."""

    src: Path
    listing: Listing
    size: int
    preserve: bool
    headers_sha256: str | None = None  # of ``kept``, when built first (entrydigest)
    kept: list[bytes] | None = None
    digests: dict[str, str] = field(default_factory=dict)  # each file's, once hashed


async def pack_dir(src: Path, *, preserve: bool = True, follow_links: bool = False
                   ) -> PackedDir:
    """The work on ``src`` before its upload (see :func:`upload_dir`); every
    file-system call in worker threads."""
    if not follow_links:
        _refuse_symlink(src)
    try:
        listing = await asyncio.to_thread(list_tree, src)
        size = await asyncio.to_thread(tar_size, src, listing)
    except OSError as exc:
        raise LocalError.from_message(f"{src}: {exc.strerror}") from exc
    return PackedDir(src, listing, size, preserve)


async def build_first(p: PackedDir) -> None:
    """Build ``p``'s tar now and keep it with its headers digest, for a send that
    replays it (the path before streaming; benchmarks compare the two)."""
    p.headers_sha256 = await _hash_tar(p, keep=True, headers_only=True)


async def _hash_tar(p: PackedDir, *, keep: bool, headers_only: bool = False) -> str:
    """A pass over ``p``'s tar for its sha256 (or headers digest), the tar kept in ``p``
    with ``keep``."""
    h = hashlib.sha256()
    kept: list[bytes] = []
    async for chunk in tar_stream(p.src, p.listing, preserve=p.preserve, digests=p.digests,
                                  hasher=h, headers_only=headers_only):
        if keep:
            kept.append(chunk)
    p.kept = kept if keep else p.kept
    return h.hexdigest()


def _sha256_of(chunks: list[bytes]) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


async def upload_dir(conn: Connection, src: Path, rp: RemotePath, *,
                     progress: Progress | None = None, backoff: Backoff | None = None,
                     rate_limit: float | None = None, preserve: bool = True,
                     follow_links: bool = False, packed: PackedDir | None = None) -> Result:
    """Send the tree under ``src`` as a tar extracted into the directory ``rp.path``;
    ``preserve=False``: entries get the container's default modes, not the local ones.
    ``src`` itself may be a symlink only with ``follow_links`` (links inside the tree
    are sent as links). ``packed``: :func:`pack_dir`'s result for the same arguments,
    when the caller started it earlier.

    The server refuses to commit anything but the tar's exact bytes: every file's data
    against its own AGGAPI.sha256 record, the rest against the tar's headers digest
    (aggapi.tar.entrydigest), so each file is hashed once. The tar is built in a worker
    as it is sent, a MiB at a time, the digest after it (sha256=headers-trailer): the
    agent extracts while the client still reads and frames files. A retry after a cut
    builds it again from the listing (files already hashed are not hashed again; one
    that changed meanwhile fails its record on the agent, which names it). An agent that
    predates the headers digest refuses it before writing anything; then the whole
    tar's sha256 goes as a trailer, or where the agent predates that too, up front: a
    tar of up to READ_ONCE_MAX bytes is then built and kept (every retry replays it), a
    bigger one is hashed in a first pass and built again for sending, in bounded memory.
    ``packed`` with a kept tar (:func:`build_first`) is sent as kept, its headers digest
    up front."""
    p = packed or await pack_dir(src, preserve=preserve, follow_links=follow_links)

    def chunks(h: Hasher | None, headers_only: bool = False) -> AsyncIterator[bytes]:
        return _replay(p.kept) if p.kept is not None else tar_stream(
            p.src, p.listing, preserve=p.preserve, digests=p.digests, hasher=h,
            headers_only=headers_only)

    def send(sha: str | None, *, headers: bool = False) -> Awaitable[Sent]:
        return _send(conn, rp, rp.params(format="tar"), "application/x-tar", p.size,
                     functools.partial(chunks, headers_only=headers), progress or NoProgress(),
                     backoff or Backoff(), rate_limit, sha, headers=headers)

    try:
        reply, retries, sha = await send(p.headers_sha256, headers=True)
    except BadRequest as exc:
        _raise_unless_refused(exc)
        if p.kept is not None:
            reply, retries, sha = await send(await asyncio.to_thread(_sha256_of, p.kept))
        else:
            reply, retries, sha = await _one_pass_or_two(
                send, functools.partial(_hash_tar, p, keep=p.size <= READ_ONCE_MAX))
    return Result(str(reply.get("path") or rp.path), "dir", int(reply.get("size") or 0),
                  sha, retries=retries, entries=len(p.listing.entries),
                  skipped=p.listing.skipped)
