"""Receive an HTTP response body of known length straight into our own buffers.

aiohttp hands a body over as one ``bytes`` per read: asyncio's TLS transport decrypts
into a fresh object, joins the records of one read, and the HTTP parser copies the
body's part out again into the StreamReader. On a download that is most of the
memcpy and malloc in the relay's and the client's profiles. asyncio's TLS transport
can instead decrypt straight into a caller's buffer (``asyncio.BufferedProtocol``:
``get_buffer``/``buffer_updated``). So once the head is in, a body with a
Content-Length is taken over from aiohttp: the bytes aiohttp already holds come
first, then the transport's protocol is swapped for a :class:`BodyReceiver`, which
decrypts into 1 MiB buffers and hands out views of them.

A buffer is never written twice: a view handed out stays valid however long its
reader (a transport's write backlog, a writer thread) keeps it, and a full buffer is
replaced by a new one. At most ``high`` received bytes wait for the reader; past that
the transport stops reading (TCP flow control holds the sender). The connection is
not reusable afterwards: the caller closes the response (aiohttp closes the
transport), as it does for a download anyway.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from typing import cast

import aiohttp

from aggapi.fs.pump import next_piece

BUFFER = 1 << 20
HIGH = 4 << 20
SPARES = 6  # full buffers kept for reuse: more than HIGH holds, plus those being written
# Reuse tells by the reference count that no view of a buffer is left: exact only with
# the GIL (a free-threaded build defers some counts), so there buffers are never reused.
REFCOUNTED = getattr(sys, "_is_gil_enabled", lambda: True)()


class BodyCut(ConnectionResetError):
    """The connection ended before the body's Content-Length was in."""


class BodyReceiver(asyncio.BufferedProtocol):
    """The rest of one body, ``remaining`` bytes, from a transport taken over."""

    def __init__(self, remaining: int, *, previous: asyncio.BaseProtocol | None = None,
                 buffer: int = BUFFER, high: int = HIGH) -> None:
        self.remaining = remaining  # not yet received
        self._previous = previous
        self._size, self._high = buffer, high
        self._buf: bytearray | None = None
        self._spares: list[bytearray] = []  # full buffers, reused once no view is left
        self.allocated = 0  # buffers made, not reused
        self._filled = self._handed = 0  # of the current buffer
        self._ready: deque[memoryview] = deque()  # received, not yet handed out
        self._held = 0  # bytes in _ready plus the current buffer's unhanded part
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._paused = False

    def attach(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        transport.set_protocol(self)
        if transport.is_reading() is False:  # aiohttp may have paused it
            transport.resume_reading()

    # -- protocol side --------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._buf is None or self._filled == len(self._buf):
            self._seal()
            if self._buf is not None and len(self._spares) < SPARES:
                self._spares.append(self._buf)
            self._buf = self._fresh(max(1, min(self._size, self.remaining)))
            self._filled = self._handed = 0
        return memoryview(self._buf)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if nbytes > self.remaining:
            self._fail(aiohttp.ClientPayloadError(
                "the server sent more than the body's Content-Length"))
            return
        self._filled += nbytes
        self.remaining -= nbytes
        self._held += nbytes
        if self._filled == len(self._buf or b"") or not self.remaining:
            self._seal()
        # Woken on whatever came (held back, it could wait for a sender that stalls);
        # a reader busy writing finds all that came meanwhile in one piece.
        self._wake()
        if self._held >= self._high and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool:
        if self.remaining:
            self._fail(BodyCut(f"connection closed with {self.remaining} bytes of the "
                               "body still to come"))
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self.remaining:
            self._fail(BodyCut(f"connection lost with {self.remaining} bytes of the body "
                               f"still to come: {exc or 'closed'}"))
        if self._previous is not None:  # aiohttp's protocol: it tracks its connection
            self._previous.connection_lost(exc)

    def _fresh(self, size: int) -> bytearray:
        """A buffer of ``size`` bytes: a spare that nothing refers to any more (no view
        of it is alive: each holds a reference), else a new one. A new bytearray is
        zeroed, and a MiB freed and allocated again faults its pages in again: about a
        tenth of a receiver's CPU."""
        for i in range(len(self._spares)):
            buf = self._spares[i]
            # References: the list, ``buf`` and getrefcount's argument; a view (ours in
            # a reader's hands, or a transport's backlog) would be a fourth.
            if len(buf) == size and sys.getrefcount(buf) == 3 and REFCOUNTED:
                del self._spares[i]
                return buf
        self.allocated += 1
        return bytearray(size)

    def _seal(self) -> None:
        """Queue the current buffer's received, unhanded part."""
        if self._buf is not None and self._filled > self._handed:
            self._ready.append(memoryview(self._buf)[self._handed:self._filled])
            self._handed = self._filled

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- reader side ----------------------------------------------------------------

    async def next_piece(self) -> memoryview | bytes:
        """The next received piece (b"" once the whole body is handed out); raises
        :class:`BodyCut` (or a ClientPayloadError) where the body went wrong, after
        every byte received before it."""
        while True:
            self._seal()
            if self._ready:
                return self._take()
            if self._error is not None:
                raise self._error
            if not self.remaining:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _take(self) -> memoryview:
        piece = self._ready.popleft()
        self._held -= len(piece)
        if self._paused and self._held < self._high // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return piece


class ResponseBody:
    """The pieces of one response's body: through a :class:`BodyReceiver` where
    :func:`take_over` can, else aiohttp's pieces as they are. The caller closes the
    response afterwards (a connection taken over is not reusable)."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        taken = take_over(resp)
        self._head = taken[0] if taken else b""
        self.receiver: BodyReceiver | None = taken[1] if taken else None

    async def next_piece(self) -> memoryview | bytes:
        """The next piece (b"" at the end)."""
        if self._head:
            head, self._head = self._head, b""
            return head
        if self.receiver is not None:
            return await self.receiver.next_piece()
        return await next_piece(self._resp.content)


def take_over(resp: aiohttp.ClientResponse) -> tuple[bytes, BodyReceiver] | None:
    """Swap ``resp``'s transport over to a :class:`BodyReceiver` for the rest of its
    body; the body bytes aiohttp holds already come with it. None where that cannot be
    done: no Content-Length, an encoded body, the body already all in."""
    conn = resp.connection
    length = resp.content_length
    if (conn is None or length is None or resp.content.is_eof()
            or resp.headers.get("Content-Encoding", "identity") != "identity"
            or resp.headers.get("Transfer-Encoding")):
        return None
    # Not isinstance(asyncio.Transport): uvloop's transports (ours in production) are
    # not its subclasses, but have all a receiver needs.
    transport = cast("asyncio.Transport | None", conn.transport)
    if transport is None or transport.is_closing():
        return None
    # No await from here on: nothing may arrive between the two halves.
    head = resp.content.read_nowait(-1)
    remaining = length - resp.content.total_bytes
    if remaining <= 0:
        return head, BodyReceiver(0)
    receiver = BodyReceiver(remaining, previous=conn.protocol, buffer=BUFFER)
    receiver.attach(transport)
    return head, receiver
