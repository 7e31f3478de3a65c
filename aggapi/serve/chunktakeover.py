"""Hand a chunked tar body to a :class:`~aggapi.serve.bodyreceiver.BodyReceiver` before
aiohttp's parser sees a byte of it.

A directory download is a tar of unknown length, sent with ``Transfer-Encoding:
chunked``. aiohttp's C parser decodes the chunk framing and keeps its state (how much
of the current chunk is still to come) to itself, and it parses every byte a read
brings, the body's first bytes with the head. So the takeover cannot wait for the
response object, as a Content-Length body's does: :class:`TakeoverHandler`, the
connection's protocol, holds each response's raw bytes until its head is whole, gives
the parser the head alone, and, where the head is that of a download it may take
(``takes``), moves the connection to a receiver with a chunk decoder and the bytes
that came after the head. Any other response (errors, progress streams, 1xx heads, a
HEAD request) goes to the parser as it came, unchanged.

The payload aiohttp made for the taken response never gets a byte: it is failed at
once, so a reader that asks it instead of :class:`~aggapi.serve.bodyreceiver.
ResponseBody` gets an error, never a wait. The connection is not reused afterwards.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any, cast

import aiohttp
from aiohttp.client_proto import ResponseHandler

from aggapi.serve.bodyreceiver import CHUNKED_BUFFER, BodyReceiver
from aggapi.serve.chunked import ChunkDecoder

# A head longer than this goes to the parser unsplit (which refuses it: its own limits
# on a line and on the headers are lower) and its response is not taken over.
MAX_HEAD = 64 << 10
TAKEN_TYPES = ("application/x-tar",)
TAKEN_MESSAGE = ("this response's chunked body was taken over: read it through "
                 "aggapi.serve.bodyreceiver.ResponseBody")


def takes(message: Any) -> bool:
    """Whether a response head (aiohttp's RawResponseMessage) is one whose body is taken
    over: a 200 tar, chunked, with no Content-Length and no content coding."""
    headers = message.headers
    return bool(message.code == 200 and message.chunked and not message.upgrade
                and "Content-Length" not in headers
                and headers.get("Transfer-Encoding", "").strip().lower() == "chunked"
                and headers.get("Content-Encoding", "identity").lower() == "identity"
                and headers.get("Content-Type", "").split(";")[0].strip().lower()
                in TAKEN_TYPES)


class TakeoverHandler(ResponseHandler):
    """aiohttp's response protocol, splitting each response's head from its body."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._head: bytearray | None = None  # raw bytes of a head not yet whole
        self._message: Any = None  # the last head the parser gave out
        self.chunked_receiver: BodyReceiver | None = None

    def set_response_params(self, **kw: Any) -> None:
        # Per request, before it is sent: the next bytes start its response's head.
        self._head = None if kw.get("skip_payload") else bytearray()
        self.chunked_receiver = None
        super().set_response_params(**kw)

    def feed_data(self, data: Any, size: int = 0) -> None:  # the parser's (head, payload)
        self._message = data[0]
        super().feed_data(data, size)

    def data_received(self, data: bytes) -> None:
        if self._head is None:
            super().data_received(data)
            return
        self._head += data
        while self._head is not None:
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > MAX_HEAD:
                    self._pass(self._head)
                else:
                    self._reschedule_timeout()  # bytes came: what sock_read measures
                return
            head = bytes(self._head[:end + 4])
            rest, self._head = self._head[end + 4:], bytearray()
            self._message = None
            super().data_received(head)
            msg = self._message
            if self._exception is not None or self.transport is None:
                self._head = None  # the parser refused the head: the connection is done
                return
            # Split only where the parser's head ends where ours does: CRLF lines only.
            if msg is None or head.count(b"\n") != head.count(b"\r\n"):
                self._pass(rest)
            elif 100 <= msg.code < 200 and msg.code != 101:
                self._head = rest  # the final head comes next
            elif takes(msg):
                self._take(rest)
            else:
                self._pass(rest)

    def _pass(self, rest: bytearray) -> None:
        """The rest of the response goes to aiohttp's parser as it came."""
        self._head = None
        if rest:
            super().data_received(bytes(rest))

    def _take(self, rest: bytearray) -> None:
        self._head = None
        self._should_close = True  # the body is the receiver's: never reused
        self._drop_timeout()  # its reads are the receiver's now
        payload = self._payload
        if payload is not None:
            payload.set_exception(aiohttp.ClientPayloadError(TAKEN_MESSAGE))
        # The parser never sees the body: it must not judge it at the connection's end.
        self._parser = None
        receiver = BodyReceiver(1, previous=self, buffer=CHUNKED_BUFFER,
                                decoder=ChunkDecoder())
        receiver.attach(cast(asyncio.Transport, self.transport))
        self.chunked_receiver = receiver
        if rest:
            receiver.feed(rest)


def takeover_connector(**kw: Any) -> aiohttp.TCPConnector:
    """An aiohttp connector (``kw`` its arguments) whose connections' protocols are
    :class:`TakeoverHandler`'s: the factory aiohttp builds, one subclass down
    (tests/serve/test_chunktakeover.py fails if aiohttp stops using it)."""
    conn = aiohttp.TCPConnector(**kw)
    factory = functools.partial(TakeoverHandler, loop=conn._loop)
    conn._factory = factory  # type: ignore[assignment]
    return conn
