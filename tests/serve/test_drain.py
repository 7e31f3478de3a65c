"""aggapi.serve.drain: copies at SIGTERM (issue 35 item 1).

The judging with a fake clock; then over real aiohttp (127.0.0.1): an upload that
cannot finish before the deadline is answered 503 + Retry-After while its client still
has most of its body to send, its handler cancelled (the agent's temp file goes with
it); one that can finish does; a new copy while draining is refused with a 503."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from aggapi.serve.drain import Drain, Transfer
from aggapi.status import status_middleware

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _transfer(total: int | None, moved: int, started: float = 0.0) -> Transfer:
    return Transfer(started, total, lambda: moved)


@pytest.mark.parametrize(("total", "moved", "now", "ok"), [
    (100 * MiB, 50 * MiB, 1.0, True),     # 50 MiB/s, 1 s left of a 5 s drain
    (100 * MiB, 10 * MiB, 1.0, False),    # 10 MiB/s: 9 s more
    (100 * MiB, 0, 1.0, False),           # nothing came: no rate to hope on
    (100 * MiB, 100 * MiB, 1.0, True),    # all in: being stored
    (None, 0, 1.0, True),                 # size unknown (a download): until the deadline
    (None, 0, 6.0, False),                # ... and not after it
    (100 * MiB, 99 * MiB, 6.0, False),    # nothing goes on past the deadline
])
async def test_finishes(total: int | None, moved: int, now: float, ok: bool) -> None:
    clock = Clock()
    clock.now = 1.0
    drain = Drain(clock=clock)
    drain.deadline = 1.0 + 5.0
    assert drain.finishes(_transfer(total, moved), now) is ok


async def test_judge_ends_only_those_that_cannot_finish() -> None:
    clock = Clock()
    drain = Drain(clock=clock)
    fast, slow = _transfer(100 * MiB, 80 * MiB), _transfer(100 * MiB, 5 * MiB)
    drain.transfers |= {fast, slow}
    clock.now = 1.0
    drain.deadline = 6.0
    assert drain.judge() == [slow]
    assert slow.ended.is_set() and not fast.ended.is_set()
    assert drain.judge() == []  # judged once
    clock.now = 6.0  # the deadline: what is left ends
    assert drain.judge() == [fast]
    assert drain.ended_early == 2


async def _serve(drain: Drain, seen: dict[str, object], first_mib: asyncio.Event
                 ) -> tuple[web.AppRunner, int]:
    async def upload(request: web.Request) -> web.StreamResponse:
        got = 0
        try:
            async for chunk, _ in request.content.iter_chunks():
                got += len(chunk)
                if got >= MiB:
                    first_mib.set()
        except asyncio.CancelledError:
            seen["cancelled"] = got  # where the agent removes its temp file
            raise
        return web.json_response({"size": got})

    async def copy(request: web.Request) -> web.StreamResponse:
        return await drain.run(request, upload)

    app = web.Application(middlewares=[status_middleware])
    app.router.add_post("/copy", copy)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


async def _post(port: int, total: int, first: int, go_on: asyncio.Event
                ) -> tuple[bytes, dict[str, str], bytes, int]:
    """POST ``total`` bytes: ``first`` of them, then the rest once ``go_on`` is set (or
    until the server stops reading). The status line, headers, body and bytes sent."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST /copy HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n".encode())
    sent = 0

    async def send() -> None:
        nonlocal sent
        chunk = b"x" * (64 * 1024)
        try:
            while sent < total:
                if sent >= first:
                    await go_on.wait()
                n = min(len(chunk), total - sent)
                writer.write(chunk[:n])
                await writer.drain()
                sent += n
        except (ConnectionError, OSError):
            pass

    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(30):
            status = await reader.readline()
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            headers = dict(line.split(": ", 1) for line in head.split("\r\n") if ": " in line)
            body = await reader.readexactly(int(headers["Content-Length"]))
    finally:
        sender.cancel()
        writer.close()
    return status, headers, body, sent


async def test_an_upload_that_cannot_finish_gets_503_while_its_client_still_sends() -> None:
    clock = Clock()
    drain = Drain(clock=clock, check_every=0.05)
    seen: dict[str, object] = {}
    first_mib = asyncio.Event()
    runner, port = await _serve(drain, seen, first_mib)
    try:
        total = 512 * MiB
        post = asyncio.create_task(_post(port, total, MiB, asyncio.Event()))
        async with asyncio.timeout(10):  # a hang fails, not a figure
            await first_mib.wait()
        clock.now = 1.0  # 1 MiB/s: 511 s to go, against a 5 s drain
        drain.start(5.0)
        status, headers, body, sent = await post
        await drain.idle()
        assert status.startswith(b"HTTP/1.1 503"), status
        assert headers["Retry-After"] == "1"
        st = json.loads(body)
        assert st["kind"] == "Status" and st["code"] == 503
        assert st["details"]["retryAfterSeconds"] == 1
        assert seen["cancelled"] == MiB  # the handler ended, nothing more taken
        assert sent < 64 * MiB, f"{sent / MiB:.0f} MiB sent into a draining server"
        assert drain.ended_early == 1 and not drain.transfers
        # Draining: a new copy is refused at once, retryable.
        status, headers, body, _ = await _post(port, MiB, MiB, asyncio.Event())
        assert status.startswith(b"HTTP/1.1 503") and headers["Retry-After"] == "1"
    finally:
        await runner.cleanup()


async def test_an_upload_that_can_finish_finishes() -> None:
    clock = Clock()
    drain = Drain(clock=clock, check_every=0.05)
    seen: dict[str, object] = {}
    first_mib = asyncio.Event()
    runner, port = await _serve(drain, seen, first_mib)
    try:
        go_on = asyncio.Event()
        post = asyncio.create_task(_post(port, 2 * MiB, MiB, go_on))
        async with asyncio.timeout(10):  # a hang fails, not a figure
            await first_mib.wait()
        clock.now = 1.0  # 1 MiB/s: 1 s to go, within a 5 s drain
        drain.start(5.0)
        idle = asyncio.create_task(drain.idle())
        await asyncio.sleep(0.2)  # a few rounds of judging
        assert not idle.done() and drain.ended_early == 0
        go_on.set()
        status, _, body, sent = await post
        await idle
        assert status.startswith(b"HTTP/1.1 200"), (status, body)
        assert json.loads(body) == {"size": 2 * MiB} and sent == 2 * MiB
        assert "cancelled" not in seen and drain.ended_early == 0
    finally:
        await runner.cleanup()
