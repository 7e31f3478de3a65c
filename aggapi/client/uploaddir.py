"""Directory uploads: the tree listed and sized before the request (it can run while
the connection is set up), then sent as a PAX tar built as it goes, each file's data
checked on the agent against its own entry's sha256 and the rest against the tar's
headers digest (:mod:`aggapi.tar.entrydigest`).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path

from aggapi.client.connection import Connection
from aggapi.client.errors import BadRequest, LocalError
from aggapi.client.packtar import Listing, list_tree, tar_size, tar_stream
from aggapi.client.remote import NoProgress, Progress, RemotePath, Result
from aggapi.client.retry import Backoff
from aggapi.client.uploader import (
    Hasher,
    Sent,
    one_pass_or_two,
    raise_unless_refused,
    refuse_symlink,
    replay,
    send_body,
)

# For an agent that wants a directory's digest before its tar, a tar up to this size
# is built once and held for sending (and every retry); a bigger one is built again
# for sending, in bounded memory. Agents that take a digest trailer get every tar
# built as it is sent.
READ_ONCE_MAX = 64 << 20


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
        refuse_symlink(src)
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
        return replay(p.kept) if p.kept is not None else tar_stream(
            p.src, p.listing, preserve=p.preserve, digests=p.digests, hasher=h,
            headers_only=headers_only)

    def send(sha: str | None, *, headers: bool = False) -> Awaitable[Sent]:
        return send_body(conn, rp, rp.params(format="tar"), "application/x-tar", p.size,
                     functools.partial(chunks, headers_only=headers), progress or NoProgress(),
                     backoff or Backoff(), rate_limit, sha, headers=headers)

    try:
        reply, retries, sha = await send(p.headers_sha256, headers=True)
    except BadRequest as exc:
        raise_unless_refused(exc)
        if p.kept is not None:
            reply, retries, sha = await send(await asyncio.to_thread(_sha256_of, p.kept))
        else:
            reply, retries, sha = await one_pass_or_two(
                send, functools.partial(_hash_tar, p, keep=p.size <= READ_ONCE_MAX))
    return Result(str(reply.get("path") or rp.path), "dir", int(reply.get("size") or 0),
                  sha, retries=retries, entries=len(p.listing.entries),
                  skipped=p.listing.skipped)
