"""Answering an upload whose body is not all read: at once, reading no more of it.

Returning normally from a handler would let aiohttp read and discard the rest of the
body for up to its lingering time (10 s) first, while the client went on sending into
a copy that has already ended. Instead the connection stops reading (the client's
sends block on flow control), the Status goes out, and after ``linger`` the
connection is closed unread: closing with unread data at once sends a reset, which
could destroy the answer in flight.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from aggapi.status import StatusError


async def answer_unread(request: web.Request, err: StatusError,
                        linger: float) -> web.StreamResponse:
    transport = request.transport
    if transport is not None:
        transport.pause_reading()
    resp = err.response()
    resp.force_close()
    await resp.prepare(request)
    await resp.write_eof()
    await asyncio.sleep(linger)
    if request.transport is not None:
        request.transport.abort()
    return resp
