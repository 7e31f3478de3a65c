"""The response headers a HEAD and a GET share: the stat header and the whole file's
sha256 (hashed in a worker, abandoned when the client leaves)."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

from aggapi import wire
from aggapi.agent.copy import download as dl
from aggapi.agent.copy.digests import CHUNK
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.settle import wait_out
from aggapi.agent.copy.state import CopyState


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def stat_header(root: FsRoot, t: dl.Target) -> dict[str, str]:
    doc = json.dumps(dl.stat_dict(root, t), separators=(",", ":")).encode()
    return {wire.HEADER_STAT: b64(doc)}


def digest_headers(digest: str) -> dict[str, str]:
    """The whole file's sha256 in our header and the two standard ones (GET and HEAD)."""
    raw = bytes.fromhex(digest)
    return {wire.HEADER_SHA256: digest, wire.HEADER_DIGEST: f"sha-256={b64(raw)}",
            wire.HEADER_REPR_DIGEST: f"sha-256=:{b64(raw)}:"}


async def digest(state: CopyState, fd: int, size: int) -> str:
    """The sha256 of the file's first ``size`` bytes (its size at lookup; a 409 if it
    has fewer now), hashed in a worker; abandoned within a chunk if this task is
    cancelled (the client left), and only then does the caller close ``fd``. A file
    bigger than a chunk is hashed by the low-priority hash threads
    (:attr:`CopyState.hashers`), so other copies' work runs first."""
    cancel = threading.Event()
    pool = state.hashers if size > CHUNK else state.workers
    fut = pool.submit(state.digests.digest, fd, size, cancel)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        cancel.set()
        await wait_out(fut)
        if not fut.cancelled():
            fut.exception()  # Cancelled, or the digest: nobody wants it now
        raise
