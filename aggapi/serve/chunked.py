"""Decode an HTTP/1.1 chunked body in place: sans-I/O, bounded, strict.

:class:`ChunkDecoder` takes the raw bytes of a ``Transfer-Encoding: chunked`` body as
they arrive, in a buffer of the caller's (:mod:`aggapi.serve.bodyreceiver` decrypts
into it), and moves the data bytes of each arrival down over the framing, so that the
buffer holds the body's data contiguously: no copy out, no join. A chunk's data moves
only by the framing bytes before it in the same arrival (a memmove of part of it), and
an arrival that is all data does not move at all.

Bounded: a chunk-size line with its extensions is at most ``MAX_LINE`` bytes, a size at
most 16 hex digits, the trailer section at most ``MAX_TRAILER`` bytes in all; a partial
line is the only state kept between arrivals. Strict: what it accepts, aiohttp's own
(llhttp) parser accepts with the same data (the property tests check it); anything else
is a :class:`ChunkError`, raised at the first byte that cannot be framing, and so is a
byte after the body's end (a connection carries one response here). It never waits
for more than the framing in hand can need: the end is the zero chunk and the empty
line after the trailers.
"""

from __future__ import annotations

import re

MAX_LINE = 4096
MAX_TRAILER = 16384

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED = rb'"[\t\x20\x21\x23-\x5b\x5d-\x7e]*"'
# 1*HEXDIG, blanks, then ;name[=token or quoted-string] extensions (ignored), CRLF.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;" + _TOKEN + rb"(?:=(?:" + _TOKEN
                        + rb"|" + _QUOTED + rb"))?)*\r\n")
# A chunk's closing CRLF and the next chunk-size line, both whole in one arrival: the
# usual framing, taken in one match where it lies (no line copied out).
_NEXT = re.compile(rb"\r\n" + _SIZE_LINE.pattern)
# A trailer field (read and dropped): name:value, visible ASCII, blanks and tabs only.
_TRAILER_LINE = re.compile(_TOKEN + rb":[\t\x20-\x7e]*\r\n")

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class ChunkError(ValueError):
    """The body's chunked framing is broken (or bytes came after its end)."""


class ChunkDecoder:
    """One chunked body's framing. :meth:`feed` each arrival; :attr:`done` once the
    zero chunk and its trailer section are in."""

    def __init__(self) -> None:
        self._state = _SIZE
        self._left = 0  # data bytes of the current chunk still to come
        self._line = bytearray()  # a framing line split between arrivals
        self._trailer = 0  # bytes of the trailer section so far
        self.data = 0  # data bytes decoded in all

    @property
    def done(self) -> bool:
        return self._state == _DONE

    def feed(self, buf: bytearray, start: int, end: int) -> int:
        """Decode the raw bytes ``buf[start:end]``: their data bytes end up at
        ``buf[start:start + n]``; returns n. Raises :class:`ChunkError` on bad framing
        (the data before it is then at ``buf[start:...]`` but not counted)."""
        view = memoryview(buf)
        out = pos = start
        while pos < end:
            if self._state == _DATA:
                n = min(self._left, end - pos)
                if out != pos:  # framing came before it in this arrival
                    view[out:out + n] = view[pos:pos + n]
                out += n
                pos += n
                self._left -= n
                if not self._left:
                    self._state = _DATA_END
                continue
            if (self._state == _DATA_END and (m := _NEXT.match(buf, pos, end)) is not None
                    and m.end() - pos <= MAX_LINE + 2):
                self._left = int(m.group(1), 16)
                self._state = _DATA if self._left else _TRAILER
                pos = m.end()
                continue
            if self._state == _DONE:
                raise ChunkError("the server sent bytes after the chunked body's end")
            pos = self._framing(buf, pos, end)
        self.data += out - start
        return out - start

    def _framing(self, buf: bytearray, pos: int, end: int) -> int:
        """Take framing bytes from ``buf[pos:end]`` up to one line's end; the new pos."""
        room = (2 if self._state == _DATA_END else MAX_LINE) - len(self._line)
        nl = buf.find(b"\n", pos, min(end, pos + room))
        if nl < 0:
            if end - pos >= room:
                raise ChunkError(self._what())
            self._line += buf[pos:end]
            return end
        if self._line:
            self._line += buf[pos:nl + 1]
            line = bytes(self._line)
            self._line.clear()
        else:
            line = bytes(buf[pos:nl + 1])
        self._line_in(line)
        return nl + 1

    def _line_in(self, line: bytes) -> None:
        if self._state == _DATA_END:
            if line != b"\r\n":
                raise ChunkError("a chunk's data is not followed by CRLF")
            self._state = _SIZE
        elif self._state == _SIZE:
            m = _SIZE_LINE.fullmatch(line)
            if m is None:
                raise ChunkError(f"bad chunk-size line {line[:64]!r}")
            self._left = int(m.group(1), 16)
            self._state = _DATA if self._left else _TRAILER
        else:
            self._trailer += len(line)
            if self._trailer > MAX_TRAILER:
                raise ChunkError("the chunked body's trailer section is too long")
            if line == b"\r\n":
                self._state = _DONE
            elif _TRAILER_LINE.fullmatch(line) is None:
                raise ChunkError(f"bad trailer field {line[:64]!r}")

    def _what(self) -> str:
        if self._state == _DATA_END:
            return "a chunk's data is not followed by CRLF"
        return ("a chunk-size line" if self._state == _SIZE else "a trailer field") + \
            f" is longer than {MAX_LINE} bytes"


def decode(body: bytes) -> bytes:
    """A whole chunked body's data (for tests and small bodies); ChunkError if it is
    broken or not all there."""
    buf = bytearray(body)
    dec = ChunkDecoder()
    n = dec.feed(buf, 0, len(buf))
    if not dec.done:
        raise ChunkError("the chunked body ended before its zero chunk and trailers")
    return bytes(buf[:n])
