"""aggapi.serve.site over real sockets: a request head has read_header_timeout seconds,
idle keep-alive connections are not cut by it, a TLS handshake gets the same bound; and
IdleTimeoutBody hands over exactly the bytes received and ends a silent wait with 408."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import StreamReader, web
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.serve.site import IdleTimeoutBody, TimeoutSite
from aggapi.status import StatusError
from aggapi.tls import pki

TIMEOUT = 1.0
# Far beyond TIMEOUT: only a connection that is never closed runs into it.
MARGIN = 20.0
HEAD = b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n"


async def _ok(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(text="ok")


Open = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[bool], Awaitable[Open]]]:
    """serve(tls) -> a function opening a raw connection to a TimeoutSite."""
    runners: list[web.AppRunner] = []
    writers: list[asyncio.StreamWriter] = []
    ca = pki.new_ca("test-ca")
    ca.write(tmp_path / "ca.crt", tmp_path / "ca.key")
    pki.issue(ca, "srv", ips=["127.0.0.1"], server=True).write(tmp_path / "s.crt",
                                                               tmp_path / "s.key")

    async def start(tls: bool) -> Open:
        app = web.Application()
        app.router.add_route("*", "/ok", _ok)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        runners.append(runner)
        server_ctx = None
        client_ctx: ssl.SSLContext | None = None
        if tls:
            server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            server_ctx.load_cert_chain(tmp_path / "s.crt", tmp_path / "s.key")
            client_ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        site = TimeoutSite(runner, "127.0.0.1", 0, ssl_context=server_ctx,
                           read_header_timeout=TIMEOUT)
        await site.start()

        async def connect() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            r, w = await asyncio.open_connection("127.0.0.1", site.port, ssl=client_ctx)
            writers.append(w)
            return r, w
        return connect

    yield start
    for w in writers:
        w.close()
    for r in runners:
        await r.cleanup()


async def closed_by_server(r: asyncio.StreamReader, within: float = MARGIN) -> bool:
    """True once the server closes the connection (EOF or reset), False if it stays open."""
    try:
        while await asyncio.wait_for(r.read(65536), within):
            pass
    except TimeoutError:
        return False
    except (ConnectionError, ssl.SSLError):
        pass
    return True


async def response(r: asyncio.StreamReader) -> bytes:
    head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), MARGIN)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return head + await r.readexactly(length)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
async def test_partial_head_is_closed_complete_head_is_answered(
        serve: Any, tls: bool) -> None:
    connect = await serve(tls)
    r1, w1 = await connect()
    w1.write(HEAD[:20])  # a request head that never ends
    r2, w2 = await connect()
    w2.write(HEAD)
    assert (await response(r2)).startswith(b"HTTP/1.1 200")
    assert await closed_by_server(r1)


async def test_idle_keepalive_is_kept_but_a_new_partial_head_is_timed(serve: Any) -> None:
    connect = await serve(False)
    r, w = await connect()
    w.write(HEAD)
    assert (await response(r)).startswith(b"HTTP/1.1 200")
    await asyncio.sleep(TIMEOUT * 2)  # idle, no bytes: the head timer is not running
    w.write(HEAD)
    assert (await response(r)).startswith(b"HTTP/1.1 200")
    w.write(HEAD[:10])
    assert await closed_by_server(r)


async def test_head_after_a_request_body_is_timed(serve: Any) -> None:
    connect = await serve(False)
    r, w = await connect()
    body = b"x" * 5000
    w.write(b"POST /ok HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n" + body[:100])
    await asyncio.sleep(TIMEOUT * 1.5)  # a slow body is not the head timer's business
    w.write(body[100:])
    assert (await response(r)).startswith(b"HTTP/1.1 200")
    w.write(HEAD[:10])
    assert await closed_by_server(r)


async def test_a_trickled_head_is_closed(serve: Any) -> None:
    """Bytes that keep coming do not extend the deadline (slowloris)."""
    connect = await serve(False)
    r, w = await connect()
    w.write(b"GET /ok HTTP/1.1\r\n")
    closed = asyncio.ensure_future(closed_by_server(r))
    for i in range(200):
        if closed.done():
            break
        w.write(f"X-Pad-{i}: y\r\n".encode())
        await asyncio.sleep(TIMEOUT / 10)
    assert await closed


async def test_tls_handshake_that_never_starts_is_closed(serve: Any) -> None:
    connect = await serve(True)
    port = (await connect())[1].get_extra_info("peername")[1]
    r, w = await asyncio.open_connection("127.0.0.1", port)  # plain TCP, no ClientHello
    try:
        assert await closed_by_server(r)
    finally:
        w.close()


class _Proto:
    """What StreamReader asks of its protocol."""

    _reading_paused = False
    connected = True

    def pause_reading(self) -> None:
        self._reading_paused = True

    def resume_reading(self, resume_parser: bool = True) -> None:
        self._reading_paused = False


def stream() -> StreamReader:
    return StreamReader(_Proto(), 1 << 30, loop=asyncio.get_running_loop())  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(pieces=st.lists(st.binary(min_size=1, max_size=300), max_size=8),
       ops=st.lists(st.tuples(st.booleans(), st.integers(0, 400)), max_size=20))
def test_idle_body_reads_exactly_what_was_received(
        pieces: list[bytes], ops: list[tuple[bool, int]]) -> None:
    async def run() -> None:
        r = stream()
        for p in pieces:
            r.feed_data(p)
        r.feed_eof()
        body = IdleTimeoutBody(r, 5.0)
        data = b"".join(pieces)
        got = b""
        for exact, n in ops:
            if exact:
                if n > len(data) - len(got):
                    with pytest.raises(asyncio.IncompleteReadError):
                        await body.readexactly(n)
                    return
                chunk = await body.readexactly(n)
                assert len(chunk) == n
            else:
                chunk = await body.read(n)
                assert len(chunk) <= n
                assert chunk or n == 0 or len(got) == len(data)
            got += chunk
            assert data.startswith(got)
        got += await body.read()
        assert got == data
        assert body.stalled is None
    asyncio.run(run())


async def test_idle_body_hands_over_received_pieces_without_copying() -> None:
    r = stream()
    pieces = [b"a" * 1000, b"b" * 3000]
    for p in pieces:
        r.feed_data(p)
    body = IdleTimeoutBody(r, 5.0)
    assert await body.read(1 << 20) is pieces[0]
    assert await body.read(1 << 20) is pieces[1]


async def test_idle_body_ends_a_silent_wait_with_408() -> None:
    r = stream()
    r.feed_data(b"abc")
    body = IdleTimeoutBody(r, 0.2)
    assert await body.read(10) == b"abc"
    with pytest.raises(StatusError) as err:
        await asyncio.wait_for(body.read(10), MARGIN)
    assert err.value.code == 408 and body.stalled is err.value


async def test_idle_body_allows_a_slow_steady_sender() -> None:
    """The limit is per wait, not for the whole body."""
    r = stream()
    body = IdleTimeoutBody(r, 1.0)

    async def feed() -> None:
        for _ in range(30):
            await asyncio.sleep(0.05)
            r.feed_data(b"x" * 10)
        r.feed_eof()

    feeder = asyncio.ensure_future(feed())
    assert await body.read() == b"x" * 300
    await feeder
