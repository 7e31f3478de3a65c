"""aggapi.serve.chunked, the sans-I/O chunk decoder, against aiohttp's own parsers (the C
one, llhttp, that our processes use, and the Python one) on the same bytes split at the
same points: a valid framing decodes to the same data wherever its arrivals are cut;
a broken one is an error, never laxer than aiohttp and never a wait where aiohttp is
done; and every bound holds. Arrivals are decoded in place as the receiver does: each
written after the data so far, its data moved down over its framing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_parser import HttpResponseParserC, HttpResponseParserPy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.serve.chunked import MAX_LINE, MAX_TRAILER, ChunkDecoder, ChunkError, decode

HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
TCHAR = "!#$%&'*+-.^_`|~0123456789abcXYZ"


def ours(raw: bytes, cuts: list[int]) -> tuple[str, bytes]:
    """("done" | "open" | "error", the data) of our decoder fed ``raw`` cut at ``cuts``."""
    buf = bytearray(len(raw) + 16)
    dec = ChunkDecoder()
    filled = prev = 0
    try:
        for cut in [*sorted(set(cuts)), len(raw)]:
            piece = raw[prev:cut]
            prev = cut
            buf[filled:filled + len(piece)] = piece
            filled += dec.feed(buf, filled, filled + len(piece))
    except ChunkError:
        return "error", bytes(buf[:filled])
    assert dec.data == filled
    return ("done" if dec.done else "open"), bytes(buf[:filled])


def theirs(cls: Any, raw: bytes, cuts: list[int]) -> tuple[str, bytes]:
    """The same from aiohttp's parser ``cls`` given the head and then ``raw``."""
    loop = asyncio.new_event_loop()
    try:
        parser = cls(BaseProtocol(loop), loop, 1 << 16, response_with_body=True)
        (_, payload), = parser.feed_data(HEAD)[0]
        prev = 0
        try:
            for cut in [*sorted(set(cuts)), len(raw)]:
                if cut > prev:
                    parser.feed_data(raw[prev:cut])
                prev = cut
        except Exception:
            return "error", b"".join(payload._buffer)
        data = b"".join(payload._buffer)
        return ("done" if payload.is_eof() else "open"), data
    finally:
        loop.close()


token = st.text(TCHAR, min_size=1, max_size=6).map(str.encode)
quoted = st.text(" \tabc!#~[]", max_size=6).map(lambda s: b'"' + s.encode() + b'"')
ext = st.tuples(token, st.one_of(st.none(), token, quoted)).map(
    lambda t: b";" + t[0] + (b"" if t[1] is None else b"=" + t[1]))


@st.composite
def framing(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A valid chunked body: (its raw bytes, its data)."""
    parts, data = [], b""
    for _ in range(draw(st.integers(0, 6))):
        chunk = draw(st.binary(min_size=1, max_size=300))
        digits = f"{len(chunk):x}"
        digits = "0" * draw(st.integers(0, 16 - len(digits))) + digits
        if draw(st.booleans()):
            digits = digits.upper()
        blanks = draw(st.sampled_from([b"", b" ", b"\t", b" \t "]))
        exts = b"".join(draw(st.lists(ext, max_size=2)))
        parts.append(digits.encode() + blanks + exts + b"\r\n" + chunk + b"\r\n")
        data += chunk
    last = b"0" * draw(st.integers(1, 3)) + b"".join(draw(st.lists(ext, max_size=1)))
    trailers = b"".join(draw(st.lists(
        st.tuples(token, st.text(" \tabc:;=", max_size=8).map(str.encode)).map(
            lambda t: t[0] + b":" + t[1] + b"\r\n"), max_size=2)))
    return b"".join(parts) + last + b"\r\n" + trailers + b"\r\n", data


def cuts_of(data: st.DataObject, raw: bytes) -> list[int]:
    return data.draw(st.lists(st.integers(0, len(raw)), max_size=12))


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.data())
def test_a_valid_framing_decodes_as_aiohttp_does_wherever_it_is_cut(data: st.DataObject
                                                                    ) -> None:
    raw, want = data.draw(framing())
    cuts = cuts_of(data, raw)
    assert ours(raw, cuts) == ("done", want)
    assert theirs(HttpResponseParserC, raw, cuts) == ("done", want)
    assert theirs(HttpResponseParserPy, raw, cuts) == ("done", want)
    # Every prefix: still open (never done early, never an error) with data so far.
    for end in sorted({len(raw) // 3, len(raw) - 1, *cuts}):
        if 0 <= end < len(raw):
            state, got = ours(raw[:end], [c for c in cuts if c <= end])
            assert state == "open" and want.startswith(got)


def test_one_byte_at_a_time() -> None:
    raw = b"5\r\nhello\r\n1a;x=\"y z\"\r\n" + bytes(range(26)) + b"\r\n0\r\nA: b\r\n\r\n"
    assert ours(raw, list(range(len(raw)))) == ("done", b"hello" + bytes(range(26)))


@st.composite
def broken(draw: st.DrawFn) -> bytes:
    """A valid framing with a few bytes replaced, inserted or dropped."""
    raw = bytearray(draw(framing())[0])
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(raw)))
        how = draw(st.sampled_from(["set", "insert", "drop"]))
        byte = draw(st.sampled_from(b"\r\n;= \t\"0aZ:\x00\x7f\xff"))
        if how == "insert":
            raw[at:at] = bytes([byte])
        elif at < len(raw):
            if how == "set":
                raw[at] = byte
            else:
                del raw[at]
    return bytes(raw)


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_broken_framing_is_refused_never_waited_on_and_never_laxer(
        data: st.DataObject) -> None:
    raw = data.draw(st.one_of(broken(), st.binary(max_size=60)))
    cuts = cuts_of(data, raw)
    state, got = ours(raw, cuts)
    c_state, c_data = theirs(HttpResponseParserC, raw, cuts)
    if state == "done":  # accepted: aiohttp accepts it too, with the same data
        assert (c_state, c_data) == ("done", got)
    if c_state == "done":  # aiohttp is done: so are we (the same) or we refused it
        assert state in ("done", "error")
    if c_state != "error":
        assert c_data.startswith(got)


@pytest.mark.parametrize("raw", [
    b"5\r\nhelloX\r\n0\r\n\r\n",  # data not followed by CRLF
    b"5\r\nhello\n0\r\n\r\n",
    b"5\nhello\r\n0\r\n\r\n",  # bare LF
    b"+5\r\nhello\r\n0\r\n\r\n", b"0x5\r\nhello\r\n0\r\n\r\n", b"\r\n5\r\nhello\r\n0\r\n\r\n",
    b"5;\r\nhello\r\n0\r\n\r\n", b"5; a=b\r\nhello\r\n0\r\n\r\n", b"5;a=b c\r\nhello\r\n0\r\n\r\n",
    b"10000000000000000\r\n",  # 17 digits
    b"5\r\nhello\r\n0\r\nX-T v\r\n\r\n", b"5\r\nhello\r\n0\r\n x: y\r\n\r\n",
    b"5\r\nhello\r\n0\r\n\r\nE",  # a byte after the end
])
def test_bad_framing_is_an_error(raw: bytes) -> None:
    with pytest.raises(ChunkError):
        decode(raw)
    assert ours(raw, list(range(len(raw))))[0] == "error"  # split anywhere, too


def test_a_body_not_all_there_is_an_error() -> None:
    with pytest.raises(ChunkError, match="ended before"):
        decode(b"5\r\nhello\r\n")


def test_a_size_line_is_bounded_without_waiting_for_its_end() -> None:
    fits = b"5;" + b"a" * (MAX_LINE - 4) + b"\r\n"
    assert len(fits) == MAX_LINE
    assert decode(fits + b"hello\r\n0\r\n\r\n") == b"hello"
    long = b"5;" + b"a" * (MAX_LINE - 2)  # MAX_LINE bytes and no end of line
    assert ours(long, [])[0] == "error"
    assert ours(long, list(range(0, len(long), 100)))[0] == "error"
    assert ours(long[:-1], [])[0] == "open"
    assert ours(fits + b"hello\r\n" + long, [])[0] == "error"  # the one-match path too


def test_the_trailer_section_is_bounded() -> None:
    field = b"x:" + b"v" * 1000 + b"\r\n"
    n = MAX_TRAILER // len(field)
    assert decode(b"0\r\n" + field * n + b"\r\n") == b""
    with pytest.raises(ChunkError, match="trailer"):
        decode(b"0\r\n" + field * (n + 1) + b"\r\n")


def test_the_largest_size_is_taken_and_waited_for() -> None:
    assert ours(b"ffffffffffffffff\r\nab", []) == ("open", b"ab")
