"""Move a byte stream into a blocking writer, one batch in a thread while the next arrives.

Pieces are handed over as received, in a list (the writer uses writev and hashes
piece by piece), never joined: the event loop, which also decrypts TLS, copies no
byte. One batch of about ``batch`` bytes is written while the next is received, so
at most about two batches are in memory. Each hand-over wakes a thread, which costs
far more on a VM than the few KiB of TLS records a read returns: batches of a MiB
pay it once per MiB. Used by the agent's uploads and the ncp client's downloads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import StreamReader

BATCH = 1 << 20


async def next_piece(stream: StreamReader) -> bytes:
    """The next piece received, as it is (b"" at the end): readchunk without its empty
    chunk-boundary markers. ``read(n)`` would join pieces, a copy of every byte."""
    while True:
        data, boundary = await stream.readchunk()
        if data or not boundary:
            return data


# A piece received: bytes, or a view of a receive buffer (aggapi.serve.bodyreceiver).
Piece = TypeVar("Piece", bound=bytes | memoryview)


async def pump(read: Callable[[int], Awaitable[Piece]],
               start: Callable[[list[Piece]], asyncio.Future[None]], *,
               batch: int = BATCH, before: Callable[[], None] | None = None,
               keep_received: bool = False) -> None:
    """Copy ``read(batch)`` pieces (b"" ends) to ``start(pieces)``, a write started in a
    thread; ``before`` runs before each batch is handed over (a liveness check).
    ``keep_received``: when ``read`` fails, the pieces received so far are written
    before the error goes on, so a resumed transfer loses none of them."""
    pieces: list[Piece] = []
    held = 0
    pending: asyncio.Future[None] | None = None
    try:
        while True:
            data = await read(batch)
            if data:
                pieces.append(data)
                held += len(data)
            if held >= batch or (not data and pieces):
                if before is not None:
                    before()
                if pending is not None:
                    await asyncio.shield(pending)  # a cancel must not lose track of it
                pending = start(pieces)
                pieces, held = [], 0
            if not data:
                break
        if pending is not None:
            await asyncio.shield(pending)
            pending = None
    except Exception:
        if keep_received and pieces:
            if pending is not None:
                await asyncio.shield(pending)
            pending = start(pieces)
            await asyncio.shield(pending)
            pending = None
        raise
    finally:
        # Never let a write run on after the caller aborts and closes the file.
        while pending is not None and not pending.done():
            try:
                await asyncio.wait([pending])
            except asyncio.CancelledError:  # cancelled again: still wait for the write
                continue
