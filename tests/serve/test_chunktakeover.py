"""aggapi.serve.chunktakeover over real TLS connections on 127.0.0.1 (each test on
asyncio's loop and on uvloop's, tests/serve/conftest.py): a chunked tar body goes to
a BodyReceiver from its first byte, whole and unchanged wherever the server's writes
cut the head and the framing, also when the server closes right after the zero chunk;
every other response (JSON streams, errors, a HEAD, a Content-Length tar, after a 1xx)
is aiohttp's as before, on a connection still reused; bad framing and a cut connection
are errors after the bytes that came, never a wait; a reader that stops reading stops
the transport."""

from __future__ import annotations

import asyncio
import gzip
import os
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.serve.bodyreceiver import (
    CHUNKED_BUFFER,
    BodyCut,
    BodyReceiver,
    ResponseBody,
)
from aggapi.serve.chunked import ChunkDecoder
from aggapi.serve.chunktakeover import TakeoverHandler, takeover_connector
from aggapi.tls import certs

MiB = 1 << 20
BODY = os.urandom(5 * MiB + 123)
TAR = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nTransfer-Encoding: chunked\r\n\r\n"


def framed(data: bytes, size: int = 32 << 10) -> bytes:
    """``data`` in chunks of ``size`` (as kube-apiserver's proxy sends a tar), ended."""
    return b"".join(b"%x\r\n" % len(data[i:i + size]) + data[i:i + size] + b"\r\n"
                    for i in range(0, len(data), size)) + b"0\r\n\r\n"


Script = list[bytes | float | str]  # bytes written, a pause (s), "close" or "abort"
Get = Callable[..., Awaitable[aiohttp.ClientResponse]]


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[tuple[Get, list[Script]]]:
    """A TLS server answering each request on a connection with the next script, and
    a GET to it through a session whose connector is takeover_connector's."""
    certs.generate(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(tmp_path / "agent.crt", tmp_path / "agent.key")
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    scripts: list[Script] = []
    served: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        served.append(task)
        try:
            while scripts:
                await reader.readuntil(b"\r\n\r\n")
                for step in scripts.pop(0):
                    if isinstance(step, bytes):
                        writer.write(step)
                        await writer.drain()
                    elif isinstance(step, float):
                        await asyncio.sleep(step)
                    elif step == "abort":
                        writer.transport.abort()
                        return
                    else:
                        writer.close()
                        return
        except (asyncio.IncompleteReadError, ConnectionError):
            return

    srv = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ctx)
    port = srv.sockets[0].getsockname()[1]
    session = aiohttp.ClientSession(connector=takeover_connector(), read_bufsize=1 << 16)

    async def get(method: str = "GET") -> aiohttp.ClientResponse:
        return await session.request(method, f"https://127.0.0.1:{port}/", ssl=client_ctx,
                                     server_hostname="aggapi-agent")

    get.connections = served  # type: ignore[attr-defined]  # one task per connection
    yield get, scripts
    await session.close()
    srv.close()
    for t in served:
        t.cancel()


async def _all(body: ResponseBody) -> bytes:
    got = bytearray()
    async with asyncio.timeout(30):
        while piece := await body.next_piece():
            got += piece
    return bytes(got)


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.sampled_from([0, 1, 4 * MiB, len(BODY)]),
       chunk=st.sampled_from([1, 7, 32 << 10, 3 * MiB]),
       cuts=st.lists(st.integers(1, 200), max_size=3))
async def test_a_chunked_tar_is_taken_over_from_its_first_byte(
        server: tuple[Get, list[Script]], size: int, chunk: int, cuts: list[int]) -> None:
    # Written cut inside the head, right after it and inside the first framing; the
    # server closes right after the zero chunk (no more reads come after it).
    get, scripts = server
    raw = TAR + framed(BODY[:size] if chunk > 1 else BODY[:3000], chunk)
    script: Script = []
    prev = 0
    for cut in sorted({min(c + len(TAR) - 100, len(raw)) for c in cuts}):
        script += [raw[prev:cut], 0.01]
        prev = cut
    scripts.append([*script, raw[prev:], "close"])
    resp = await get()
    body = ResponseBody(resp)
    assert isinstance(body.receiver, BodyReceiver)
    assert await _all(body) == (BODY[:size] if chunk > 1 else BODY[:3000])
    resp.close()


@pytest.mark.parametrize("size", [4 * MiB, 4 * MiB + 7, len(BODY)])
async def test_a_body_whose_connection_ends_without_a_tls_close_is_all_read(
        tmp_path: Path, size: int) -> None:
    # At TCP's end (no close_notify) uvloop drops what its TLS layer holds, and a
    # buffered protocol's read that fills its buffer exactly leaves the rest there. A
    # blocking server: sendall has every byte in the kernel before the FIN.
    certs.generate(tmp_path)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp_path / "agent.crt", tmp_path / "agent.key")
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            while b"\r\n\r\n" not in tls.recv(65536):
                pass
            tls.sendall(TAR + framed(BODY[:size]))
            tls.shutdown(socket.SHUT_WR)  # a FIN, no close_notify
            done.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    try:
        async with aiohttp.ClientSession(connector=takeover_connector()) as session:
            resp = await session.get(f"https://127.0.0.1:{listener.getsockname()[1]}/",
                                     ssl=client_ctx, server_hostname="aggapi-agent")
            body = ResponseBody(resp)
            assert body.receiver is not None
            # Never paused: uvloop drops what its TLS layer holds at such an end while
            # reading is paused, for any protocol (aiohttp's too); this is the room rule.
            body.receiver._high = 1 << 30
            assert await _all(body) == BODY[:size]
            resp.close()
    finally:
        done.set()
        listener.close()


def test_a_chunked_receiver_always_offers_room_for_what_the_transport_holds() -> None:
    receiver = BodyReceiver(1, buffer=CHUNKED_BUFFER, decoder=ChunkDecoder())
    receiver.feed(b"%x\r\n" % (64 * MiB))
    for n in [1, 1000, 300_000, 700_000, 1_000_000, 12345, 64 << 10, 1]:
        for _ in range(20):
            buf = receiver.get_buffer(-1)
            assert len(buf) >= 512 << 10  # the TLS layers hold 256 KiB + one 256 KiB read
            got = min(n, len(buf))
            del buf
            receiver.buffer_updated(got)
            while receiver.piece_nowait() is not None:
                pass


async def test_pieces_are_views_of_our_buffers_and_aiohttp_never_sees_the_body(
        server: tuple[Get, list[Script]]) -> None:
    get, scripts = server
    scripts.append([TAR + framed(BODY), 30.0])  # keep-alive: the server does not close
    resp = await get()
    conn = resp.connection
    assert conn is not None and isinstance(conn.protocol, TakeoverHandler)
    body = ResponseBody(resp)
    pieces = []
    async with asyncio.timeout(30):
        while piece := await body.next_piece():
            pieces.append(piece)
    assert b"".join(pieces) == BODY
    assert all(isinstance(p, memoryview) for p in pieces)
    # Asked instead of ResponseBody, aiohttp's payload fails at once: never a wait.
    with pytest.raises(aiohttp.ClientPayloadError, match="taken over"):
        await resp.content.read(1)
    resp.close()


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/x-tar\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\nContent-Encoding: gzip\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n",
])
async def test_other_chunked_responses_stay_with_aiohttp_and_the_connection_is_reused(
        server: tuple[Get, list[Script]], head: bytes) -> None:
    get, scripts = server
    data = gzip.compress(b"x" * 100_000) if b"gzip" in head else b"x" * 100_000
    scripts += [[head + framed(data, 1000)], [TAR + framed(BODY[:MiB])]]
    first = await get()
    assert ResponseBody(first).receiver is None
    assert await first.content.read() == b"x" * 100_000
    first.release()
    second = await get()  # the same connection, its next head split again
    assert len(get.connections) == 1  # type: ignore[attr-defined]
    body = ResponseBody(second)
    assert body.receiver is not None
    assert await _all(body) == BODY[:MiB]
    second.close()


async def test_a_length_tar_and_a_head_request_are_not_the_chunked_receivers(
        server: tuple[Get, list[Script]]) -> None:
    get, scripts = server
    scripts += [[TAR], [b"HTTP/1.1 200 OK\r\nContent-Type: application/x-tar\r\n"
                        b"Content-Length: %d\r\n\r\n" % MiB + BODY[:1000], 0.05,
                        BODY[1000:MiB]]]
    head = await get("HEAD")
    assert head.status == 200 and ResponseBody(head).receiver is None
    head.release()
    resp = await get()
    body = ResponseBody(resp)
    assert body.receiver is not None and body.receiver._decoder is None
    assert await _all(body) == BODY[:MiB]
    resp.close()


async def test_a_chunked_tar_after_a_1xx_head_is_taken_over(
        server: tuple[Get, list[Script]]) -> None:
    get, scripts = server
    scripts.append([b"HTTP/1.1 102 Processing\r\n\r\n" + TAR[:30], 0.01,
                    TAR[30:] + framed(BODY[:MiB]), "close"])
    resp = await get()
    assert resp.status == 200
    body = ResponseBody(resp)
    assert body.receiver is not None
    assert await _all(body) == BODY[:MiB]
    resp.close()


@pytest.mark.parametrize("bad", [b"8000\r\n" + BODY[:32768] + b"XX", b"zz\r\n",
                                 b"1;" + b"a" * 5000])
async def test_bad_framing_is_an_error_after_the_data_before_it(
        server: tuple[Get, list[Script]], bad: bytes) -> None:
    get, scripts = server
    good = framed(BODY[:MiB])[:-5]  # without the zero chunk
    scripts.append([TAR + good, 0.05, bad, 30.0])  # the server then waits: no hang here
    resp = await get()
    body = ResponseBody(resp)
    got = bytearray()
    with pytest.raises(aiohttp.ClientPayloadError, match="bad chunked body"):
        async with asyncio.timeout(20):
            while piece := await body.next_piece():
                got += piece
    assert bytes(got) == BODY[:MiB]
    resp.close()


@pytest.mark.parametrize("end", ["close", "abort"])
async def test_a_connection_ended_mid_body_raises_body_cut_after_the_bytes_that_came(
        server: tuple[Get, list[Script]], end: str) -> None:
    get, scripts = server
    scripts.append([TAR + framed(BODY[:MiB])[:-5] + b"100\r\nabc", 0.2, end])
    resp = await get()
    body = ResponseBody(resp)
    got = bytearray()
    with pytest.raises(BodyCut):  # a ConnectionError: the client resumes or retries
        async with asyncio.timeout(20):
            while piece := await body.next_piece():
                got += piece
    assert bytes(got) == BODY[:MiB] + b"abc"
    resp.close()


async def test_a_reader_that_stops_reading_stops_the_transport(
        server: tuple[Get, list[Script]]) -> None:
    get, scripts = server
    scripts.append([TAR + framed(BODY), 60.0])
    resp = await get()
    body = ResponseBody(resp)
    receiver = body.receiver
    assert receiver is not None
    await asyncio.sleep(1.0)  # nobody reads
    assert receiver._paused
    assert receiver._held <= receiver._high + 2 * MiB  # the mark plus one buffer
    assert receiver.allocated <= 4
    first = await body.read(1000)  # reading again resumes it; read() joins as asked
    assert first == BODY[:1000]
    rest = bytearray()
    async with asyncio.timeout(30):
        while piece := await body.read(MiB):
            assert len(piece) <= MiB
            rest += piece
    assert first + rest == BODY
    resp.close()
