"""Serving HTTP with bounded waits: a request-head read timeout and a body idle timeout.

aiohttp has neither. Its keep-alive timer only covers a connection waiting for its
next request, so a client that sends part of a request head and stops holds the
connection (and its TLS state) for as long as the keep-alive timeout, about an hour
by default. :class:`TimeoutSite` serves with :class:`HeaderTimeoutHandler`, which
closes a connection whose request head is not complete ``read_header_timeout``
seconds after it began (as Go's ``http.Server.ReadHeaderTimeout``). The same bound
applies to the TLS handshake and to a fresh connection that sends nothing.

Bodies are bounded where they are read: :class:`IdleTimeoutBody` wraps a request
body so that every wait for more bytes ends after ``idle`` seconds with a 408
Status. Time the handler spends not reading (a slow disk, a full pipe downstream)
does not count: only silence from the client does.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import StreamReader, web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from aggapi.status import StatusError

log = logging.getLogger(__name__)

# Idle keep-alive connections close after this many seconds: longer than the 90 s
# after which Go clients (kube-apiserver's proxy) drop their own idle connections, so
# the client side closes first and never sends a request into a closing socket.
KEEPALIVE_TIMEOUT = 120.0
DEFAULT_READ_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_IDLE_TIMEOUT = 60.0
# aiohttp buffers a body up to twice this before it stops reading the socket (64 KiB by
# default): at 64 KiB a copy's reader and the socket take turns, pausing and resuming
# reading every 128 KiB, and every wake-up carries only a few small pieces.
READ_BUFSIZE = 1 << 20


class HeaderTimeoutHandler(RequestHandler):
    """aiohttp's connection handler with a deadline on each request head.

    The deadline is set when the connection is made (after the TLS handshake) and
    when bytes of a new request arrive after the previous request's body; a complete
    head clears it. An idle keep-alive connection (no bytes at all) is left to the
    keep-alive timer. This relies on RequestHandler internals (``_request_count``,
    ``_messages``), which tests/serve/test_site.py exercises over real sockets.
    """

    __slots__ = ("_header_timer", "_last_payload", "_read_header_timeout")

    def __init__(self, manager: Server, *, read_header_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._read_header_timeout = read_header_timeout
        self._header_timer: asyncio.TimerHandle | None = None
        # The body of the newest complete request head: bytes that come once it is
        # complete belong to the next head.
        self._last_payload: StreamReader | None = None

    def _arm(self) -> None:
        if self._read_header_timeout > 0 and self._header_timer is None:
            self._header_timer = self._loop.call_later(self._read_header_timeout,
                                                       self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        log.debug("closing a connection: request head not complete in %g s",
                  self._read_header_timeout, extra={"peer": str(self.peername)})
        self.force_close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        self._last_payload = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        between = self._last_payload is None or self._last_payload.is_eof()
        heads = self._request_count
        super().data_received(data)
        if self._request_count != heads:
            self._disarm()
            self._last_payload = self._messages[-1][1] if self._messages else None
        elif between and data:
            self._arm()


class TimeoutSite(web.TCPSite):
    """A TCPSite whose connections use :class:`HeaderTimeoutHandler`; the TLS
    handshake gets the same ``read_header_timeout``."""

    __slots__ = ("_read_header_timeout",)

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, *,
                 read_header_timeout: float, ssl_context: Any = None) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self._read_header_timeout = read_header_timeout

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        # Server() would build a plain RequestHandler: build ours with the same
        # settings (the AppRunner's keyword arguments).
        settings: dict[str, Any] = dict(server._kwargs)

        def protocol() -> HeaderTimeoutHandler:
            return HeaderTimeoutHandler(server, loop=loop,
                                        read_header_timeout=self._read_header_timeout,
                                        **settings)

        handshake = (self._read_header_timeout
                     if self._ssl_context is not None and self._read_header_timeout > 0
                     else None)
        self._server = await loop.create_server(
            protocol, self._host, self._port, ssl=self._ssl_context,
            ssl_handshake_timeout=handshake, backlog=self._backlog)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port


def body_stalled(idle: float) -> StatusError:
    return StatusError(408, f"no request body bytes arrived for {idle:g} s: the upload "
                       "was aborted", reason="Timeout")


class IdleTimeoutBody:
    """A request body (read/readexactly, as aggapi.tar.stream.ByteStream) whose every
    wait for bytes ends after ``idle`` seconds (0: no limit) with a 408 StatusError.

    ``read(n)`` hands over received pieces as they are (sliced only when a piece is
    longer than ``n``), so no byte is joined or copied on the way. ``stalled`` keeps
    the error, for callers whose parsers turn read errors into their own.
    """

    def __init__(self, body: StreamReader, idle: float) -> None:
        self.body = body
        self.idle = idle
        self.stalled: StatusError | None = None
        self._piece = b""
        self._pos = 0

    async def _next_piece(self) -> bytes:
        if getattr(self.body, "_buffer", None):
            # Bytes are already buffered: readchunk returns without waiting, so no
            # timer is needed (arming one per piece cost ~5% of an upload's CPU).
            data, end_of_http_chunk = await self.body.readchunk()
            if data or not end_of_http_chunk:
                return data
        try:
            async with asyncio.timeout(self.idle if self.idle > 0 else None):
                while True:
                    data, end_of_http_chunk = await self.body.readchunk()
                    # (b"", True) marks the end of an HTTP chunk, not of the body.
                    if data or not end_of_http_chunk:
                        return data
        except TimeoutError:
            self.stalled = body_stalled(self.idle)
            raise self.stalled from None

    async def read(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        if n < 0:
            parts = []
            while data := await self.read(1 << 20):
                parts.append(data)
            return b"".join(parts)
        if self._pos >= len(self._piece):
            self._piece, self._pos = await self._next_piece(), 0
        piece, pos = self._piece, self._pos
        if n >= len(piece) - pos:
            self._piece, self._pos = b"", 0
            return piece[pos:] if pos else piece
        self._pos = pos + n
        return piece[pos:pos + n]

    async def readexactly(self, n: int) -> bytes:
        parts: list[bytes] = []
        need = n
        while need > 0:
            data = await self.read(need)
            if not data:
                raise asyncio.IncompleteReadError(b"".join(parts), n)
            parts.append(data)
            need -= len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)
