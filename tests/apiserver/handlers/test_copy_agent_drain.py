"""Issue 35 items 2 and 4: the agent, or the apiserver replica relaying the copy, drains
(told to stop) while an upload's client still has most of its body to send. The agent
answers 503 + Retry-After at once and closes, and the relay passes that Status on at
once, Retry-After kept; or the relay itself answers it, the agent's connection closed.
Either way no more of the body is read.

The agent is a stand-in over TLS running the real aggapi.serve.drain in front of a
handler that takes the body as the agent's does (a real one needs containerd);
everything else is the real apiserver with its real AgentClient."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from aggapi.serve.drain import Drain
from aggapi.tls import certs as aggapi_certs
from tests.framework.fakekube import FakeKube

from .conftest import raw_upload, read_answer, relay_to_standin, serve_standin_agent

MiB = 1 << 20


@pytest.mark.parametrize("who", ["agent", "apiserver"])
async def test_a_draining_server_s_503_reaches_the_client_at_once(
        tmp_path: Path, make_server: Any, kube: FakeKube, who: str) -> None:
    pki = tmp_path / "agent-pki"
    aggapi_certs.generate(pki)
    drain = Drain(check_every=0.05)
    taking = asyncio.Event()

    agent_cancelled = asyncio.Event()

    async def take(request: web.Request) -> web.StreamResponse:
        try:
            async for _chunk, _ in request.content.iter_chunks():
                if request.content.total_bytes >= 4 * MiB:
                    taking.set()
        except (asyncio.CancelledError, ConnectionError):  # the relay closed: the agent
            # removes its temp file
            agent_cancelled.set()
            raise
        return web.json_response({})

    async def copy(request: web.Request) -> web.StreamResponse:
        return await drain.run(request, take)

    app = web.Application()
    app.router.add_post("/v1/copy", copy)
    runner, port = await serve_standin_agent(app, pki)
    try:
        srv = await relay_to_standin(make_server, kube, pki, port, shutdown_grace=5.0)
        total = 1024 * MiB  # sent whatever is answered (raw_upload)
        reader, writer = await raw_upload(srv, total)
        sent = 0
        sent_at_drain: int | None = None

        async def send() -> None:
            nonlocal sent
            chunk = b"x" * (256 * 1024)
            try:
                while sent < total:
                    writer.write(chunk)
                    await writer.drain()
                    sent += len(chunk)
                    if sent >= 8 * MiB:
                        await asyncio.sleep(0.01)  # ~25 MiB/s: 40 s to go
            except (ConnectionError, OSError):
                pass

        sender = asyncio.create_task(send())
        try:
            async with asyncio.timeout(30):
                await taking.wait()
                sent_at_drain = sent
                t_drain = time.monotonic()
                if who == "agent":
                    drain.start(5.0)
                else:  # SIGTERM's path once the replica's shutdown delay is over
                    stopping = asyncio.create_task(srv.runner.cleanup())
                status_line, answered, headers, status = await read_answer(reader)
            done, _ = await asyncio.wait([sender], timeout=5)
        finally:
            sender.cancel()
            writer.close()
        assert status_line.startswith(b"HTTP/1.1 503"), status_line
        assert status["kind"] == "Status" and status["code"] == 503, status
        assert "shutting down" in status["message"]
        assert headers.get("Retry-After") == "1", headers
        after = sent - sent_at_drain
        print(f"\n{who} drained after {sent_at_drain / MiB:.0f} MiB; 503 at the client "
              f"{answered - t_drain:.3f} s later; {after / MiB:.1f} MiB sent after it")
        if who == "agent":
            assert drain.ended_early == 1
        else:
            assert srv.parts.lifecycle.copies.ended_early == 1
            async with asyncio.timeout(10):
                await agent_cancelled.wait()
                await stopping
        assert sender in done, f"still sending {sent / MiB:.0f} MiB in"
        assert after < 64 * MiB, f"{after / MiB:.0f} MiB read after the drain ended it"
    finally:
        await runner.cleanup()
