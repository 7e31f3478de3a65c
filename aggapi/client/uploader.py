"""Uploads of a regular file, and the send every upload shares: the body under its
sha256 (after its bytes, hashed as they are sent, or up front for an agent that
predates the trailer), retried whole (uploads are atomic on the agent), the server's
reply compared with what was sent.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from aggapi import wire
from aggapi.client.connection import Connection
from aggapi.client.errors import AggapiError, BadRequest, IntegrityError, LocalError, TransferError
from aggapi.client.remote import NoProgress, Progress, RateLimit, RemotePath, Result
from aggapi.client.retry import CATCH, Backoff, wait_or_raise

CHUNK = 1 << 20


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


def refuse_symlink(src: Path) -> None:
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
        reply, retries, sha = await one_pass_or_two(
            functools.partial(send_body, conn, rp, params, "application/octet-stream", size,
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


async def one_pass_or_two(send: Callable[[str | None], Awaitable[Sent]],
                           digest: Callable[[], Awaitable[str]]) -> Sent:
    """One pass: hashed while sent, the digest after the bytes (sha256=trailer). An
    agent that predates the trailer refuses it up front; then a first pass hashes and
    the digest goes in the query."""
    try:
        return await send(None)
    except BadRequest as exc:
        raise_unless_refused(exc)
    return await send(await digest())


def raise_unless_refused(exc: BadRequest) -> None:
    """Re-raise ``exc`` unless it is an agent refusing a sha256 form it predates (which
    it answers before it writes anything)."""
    if wire.SHA256_REFUSED not in str(exc):
        raise exc


def _read(fd: int, n: int, off: int, h: Hasher | None) -> bytes:
    chunk = os.pread(fd, n, off)
    if h is not None:
        h.update(chunk)  # in the reading thread: hashlib lets go of the GIL
    return chunk


async def send_body(conn: Connection, rp: RemotePath, params: list[tuple[str, str]],
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


async def replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
