"""The response headers a HEAD and a GET share: the stat header and the whole file's
sha256 (hashed in a worker, abandoned when the client leaves)."""

from __future__ import annotations

import asyncio
import base64
import json
import stat as st_
import threading

from aggapi import wire
from aggapi.agent.copy import download as dl
from aggapi.agent.copy.digests import Cancelled
from aggapi.agent.copy.fds import opened
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.settle import wait_out
from aggapi.agent.copy.state import CopyState
from aggapi.status import StatusError


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


async def digest(state: CopyState, fd: int) -> str:
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


async def file_digest_headers(state: CopyState, t: dl.Target) -> dict[str, str]:
    """For HEAD on a regular file: the same digest headers GET sends, when the digest
    is cached or the file is within the size limit (hashing more would hold a worker
    for what GET would refuse anyway). A file GET would refuse (a pseudo file, no read
    permission) gets none: HEAD still answers the stat."""
    if not st_.S_ISREG(t.st.st_mode):
        return {}
    try:
        async with opened(state, t, dl.open_regular) as fd:
            if t.st.st_size > state.limits.size_limit:
                cached = await state.workers.run(state.digests.cached, fd)
                return digest_headers(cached) if cached is not None else {}
            return digest_headers(await digest(state, fd))
    except (StatusError, Cancelled):
        return {}
