"""Graceful shutdown: stop accepting, let streams run the grace period, then end them."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggapi.apiserver.parts import Parts
from aggapi.apiserver.routes import Route

from .conftest import Server


def _add_stream_route(parts: Parts) -> list[Route]:
    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        async with parts.lifecycle.track("") as shutdown:
            await resp.prepare(request)
            await resp.write(b"start\n")
            await shutdown.wait()
            await resp.write(b"final\n")
        await resp.write_eof()
        return resp

    return [Route(("GET",), "/test/stream", stream)]


async def test_streams_get_the_grace_period_then_end_cleanly(make_server: Any) -> None:
    srv: Server = await make_server(setup=_add_stream_route, shutdown_grace=0.5,
                                    always_allow_metrics=True)
    srv.kube.sar_policy = lambda _spec: True
    cert = srv.certs.client_pair(srv.certs.client_ca, "carol")
    sess = srv.session(cert)
    async with sess.get("/test/stream") as resp:
        assert await resp.content.readline() == b"start\n"
        assert srv.metric("aggapi_apiserver_streams_in_flight", subresource="") == 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        stopping = asyncio.create_task(srv.runner.cleanup())
        await asyncio.sleep(0.1)
        lifecycle = srv.parts.lifecycle
        assert lifecycle.draining.is_set() and not lifecycle.shutdown.is_set()
        # No new connections while draining.
        with pytest.raises(aiohttp.ClientConnectorError):
            async with aiohttp.ClientSession() as other:
                await other.get(srv.url + "/healthz", ssl=False)
        # The stream ends with its final object after the grace period, not before.
        assert await resp.content.readline() == b"final\n"
        assert loop.time() - started >= 0.45
        assert await resp.content.read() == b""
    await stopping
    assert srv.metric("aggapi_apiserver_streams_in_flight", subresource="") == 0


async def test_idle_server_stops_without_waiting_the_grace(make_server: Any) -> None:
    srv: Server = await make_server(shutdown_grace=30)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await srv.runner.cleanup()
    assert loop.time() - started < 5
    assert srv.parts.lifecycle.shutdown.is_set()
