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

A chunked body (a directory's tar has no length) is taken over too, but earlier:
aiohttp's parser keeps its chunk state to itself, so the connection's protocol
(:mod:`aggapi.serve.chunktakeover`) hands it to a receiver before the parser sees any
of its bytes, and a :class:`~aggapi.serve.chunked.ChunkDecoder` moves each arrival's
data down over its framing in the same buffers.
"""

from __future__ import annotations

import asyncio
import sys
from collections import deque
from typing import cast

import aiohttp

from aggapi.fs.pump import next_piece
from aggapi.serve.chunked import ChunkDecoder, ChunkError

BUFFER = 1 << 20
HIGH = 4 << 20
# A chunked body's length is unknown, so each read is offered at least this much room.
# A TLS transport's read that fills a buffer exactly leaves the rest for a later read,
# which never comes if TCP ends meanwhile with no close_notify (uvloop drops it). A read
# with room for all the TLS layer holds (its read high-water mark, 256 KiB, plus one
# 256 KiB socket read) leaves nothing behind.
MIN_ROOM = 640 << 10
CHUNKED_BUFFER = 2 << 20
SPARES = 6  # full buffers kept for reuse: more than HIGH holds, plus those being written
# Reuse tells by the reference count that no view of a buffer is left: exact only with
# the GIL (a free-threaded build defers some counts), so there buffers are never reused.
REFCOUNTED = getattr(sys, "_is_gil_enabled", lambda: True)()


class BodyCut(ConnectionResetError):
    """The connection ended before the body's Content-Length was in."""


class BodyReceiver(asyncio.BufferedProtocol):
    """The rest of one body, ``remaining`` bytes, from a transport taken over; with a
    ``decoder``, a chunked body (``remaining`` is then 1 until its end is in)."""

    def __init__(self, remaining: int, *, previous: asyncio.BaseProtocol | None = None,
                 buffer: int = BUFFER, high: int = HIGH,
                 decoder: ChunkDecoder | None = None) -> None:
        self.remaining = remaining  # not yet received
        self._decoder = decoder
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
        room = 1 if self._decoder is None else MIN_ROOM
        if self._buf is None or len(self._buf) - self._filled < room:
            self._seal()
            if self._buf is not None and len(self._spares) < SPARES:
                self._spares.append(self._buf)
            want = self._size if self._decoder is not None else self.remaining
            self._buf = self._fresh(max(1, min(self._size, want)))
            self._filled = self._handed = 0
        return memoryview(self._buf)[self._filled:]

    def buffer_updated(self, nbytes: int) -> None:
        if self._decoder is not None:  # raw bytes: their data moves down over the framing
            try:
                nbytes = self._decoder.feed(cast(bytearray, self._buf), self._filled,
                                            self._filled + nbytes)
            except ChunkError as exc:
                self._fail(aiohttp.ClientPayloadError(f"bad chunked body: {exc}"))
                if self._transport is not None:  # read no more of it
                    self._transport.abort()
                return
            self.remaining = 0 if self._decoder.done else 1
        elif nbytes > self.remaining:
            self._fail(aiohttp.ClientPayloadError(
                "the server sent more than the body's Content-Length"))
            return
        else:
            self.remaining -= nbytes
        self._filled += nbytes
        self._held += nbytes
        if self._filled == len(self._buf or b"") or not self.remaining:
            self._seal()
        # Woken on whatever came (held back, it could wait for a sender that stalls);
        # a reader busy writing finds all that came meanwhile in one piece.
        self._wake()
        if self._held >= self._high and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()

    def feed(self, data: bytes | bytearray) -> None:
        """Take ``data`` as if the transport had received it (what came with the head)."""
        view = memoryview(data)
        while view and self._error is None:
            buf = self.get_buffer(len(view))
            n = min(len(buf), len(view))
            buf[:n] = view[:n]
            del buf  # no view of ours may outlive the call (buffer reuse counts them)
            self.buffer_updated(n)
            view = view[n:]

    def _missing(self) -> str:
        return ("the chunked body's end" if self._decoder is not None
                else f"{self.remaining} bytes of the body")

    def eof_received(self) -> bool:
        if self.remaining:
            self._fail(BodyCut(f"connection closed with {self._missing()} still to come"))
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        if self.remaining:
            self._fail(BodyCut(f"connection lost with {self._missing()} still to come: "
                               f"{exc or 'closed'}"))
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

    def piece_nowait(self) -> memoryview | None:
        """A received piece if one is waiting, else None (no error, no end)."""
        self._seal()
        return self._take() if self._ready else None

    def _take(self) -> memoryview:
        piece = self._ready.popleft()
        self._held -= len(piece)
        if self._paused and self._held < self._high // 2 and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return piece


class ResponseBody:
    """The pieces of one response's body: through a :class:`BodyReceiver` where the
    connection's protocol took a chunked body over (:mod:`aggapi.serve.chunktakeover`)
    or :func:`take_over` can, else aiohttp's pieces as they are. The caller closes the
    response afterwards (a connection taken over is not reusable)."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        conn = resp.connection
        chunked = getattr(conn.protocol, "chunked_receiver", None) if conn else None
        taken = (b"", chunked) if isinstance(chunked, BodyReceiver) else take_over(resp)
        self._head: bytes | memoryview = taken[0] if taken else b""
        self.receiver: BodyReceiver | None = taken[1] if taken else None

    async def next_piece(self) -> memoryview | bytes:
        """The next piece (b"" at the end)."""
        if self._head:
            head, self._head = self._head, b""
            return head
        if self.receiver is not None:
            return await self.receiver.next_piece()
        return await next_piece(self._resp.content)

    async def read(self, n: int = -1) -> bytes:
        """What has arrived, at least a byte and at most ``n`` (b"" at the end), as one
        ``bytes`` (the tar parser's input): one copy, the join of the pieces."""
        if self.receiver is None and not self._head:
            return await self._resp.content.read(n)
        parts = [await self.next_piece()]
        size, limit = len(parts[0]), n if n >= 0 else 1 << 62
        while size < limit and (piece := self._ready()) is not None:
            parts.append(piece)
            size += len(piece)
        if size > limit:  # the last piece's rest comes first next time
            last = parts[-1]
            cut = len(last) - (size - limit)
            parts[-1], self._head = last[:cut], last[cut:]
        return b"".join(parts)

    async def pieces(self, n: int) -> list[bytes | memoryview]:
        """What has arrived, at least a byte and about ``n`` (more by at most one
        piece), as the pieces received: no copy; [] at the end."""
        if self.receiver is None and not self._head:
            data = await self._resp.content.read(n)
            return [data] if data else []
        first = await self.next_piece()
        if not first:
            return []
        parts, size = [first], len(first)
        while size < n and (piece := self._ready()) is not None:
            parts.append(piece)
            size += len(piece)
        return parts

    async def readexactly(self, n: int) -> bytes:
        data = bytearray()
        while len(data) < n:
            if not (piece := await self.read(n - len(data))):
                raise asyncio.IncompleteReadError(bytes(data), n)
            data += piece
        return bytes(data)

    def _ready(self) -> bytes | memoryview | None:
        if self._head:
            head, self._head = self._head, b""
            return head
        return self.receiver.piece_nowait() if self.receiver is not None else None


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
