"""A download relayed while its agent dies mid-body: the client's download ends (its
connection is cut after the bytes the agent sent, so it resumes from there) instead of
waiting forever for the rest of its Content-Length, as it did when the relay answered a
500 Status after the response head had already gone out. And the other way: a client
gone mid-body closes the agent's connection. Bodies (Content-Length or chunked) and the
agent's error Status pass unchanged.

The agent is a stand-in serving TLS with the agent's certificate (a real one needs
containerd, see test_copy.py); everything else is the real apiserver and AgentClient."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggapi.apiserver.handlers import copy as copy_handler
from aggapi.serve.bodyreceiver import ResponseBody
from aggapi.tls import certs as aggapi_certs
from tests.framework.fakekube import FakeKube

from ..conftest import GV, Server
from .conftest import relay_to_standin, serve_standin_agent

MiB = 1 << 20
BODY = os.urandom(3 * MiB + 17)


@dataclass
class Agent:
    """How the stand-in answers, and what it saw: request heads, its handler's end."""

    mode: str = "length"  # length, chunked, tar (chunked), error, die, tardie, short, stall
    heads: list[dict[str, str]] = field(default_factory=list)
    queries: list[dict[str, str]] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)


async def _agent(pki_dir: Path, agent: Agent) -> tuple[web.AppRunner, int]:
    async def copy(request: web.Request) -> web.StreamResponse:
        agent.heads.append(dict(request.headers))
        agent.queries.append(dict(request.query))
        if agent.mode == "error":
            raise web.HTTPNotFound(text='{"kind":"Status","apiVersion":"v1","code":404,'
                                        '"reason":"NotFound","message":"no such file"}',
                                   content_type="application/json")
        if agent.mode == "trailer":  # a resumed digest=trailer reply, as the agent's
            at = int(request.headers["Range"][6:-1])
            resp = web.StreamResponse(status=206, headers={
                "X-Aggapi-Sha256": "trailer",
                "Content-Range": f"bytes {at}-{len(BODY) - 1}/{len(BODY)}"})
            resp.content_length = len(BODY) - at + 32
            await resp.prepare(request)
            await resp.write(BODY[at:] + hashlib.sha256(BODY).digest())
            await resp.write_eof()
            return resp
        tar = agent.mode.startswith("tar")  # a directory: a chunked tar
        resp = web.StreamResponse(headers={"X-Aggapi-Sha256": "ab" * 32, **(
            {"Content-Type": "application/x-tar"} if tar else {})})
        if agent.mode == "chunked" or tar:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = len(BODY)
        await resp.prepare(request)
        try:
            if agent.mode in ("die", "short", "stall", "tardie"):
                await resp.write(BODY[:MiB])
                if agent.mode in ("die", "short", "tardie"):
                    await asyncio.sleep(0.5)
                    assert request.transport is not None
                    if agent.mode in ("die", "tardie"):
                        request.transport.abort()  # the process is gone
                    else:  # a clean TLS close before the Content-Length is reached
                        request.transport.close()
                await asyncio.sleep(3600)
            for at in range(0, len(BODY), 100_000):
                await resp.write(BODY[at:at + 100_000])
            await resp.write_eof()
        finally:
            agent.gone.set()
        return resp

    app = web.Application()
    app.router.add_get("/v1/copy", copy)
    return await serve_standin_agent(app, pki_dir)


@pytest.fixture
async def relay(tmp_path: Path, make_server: Any, kube: FakeKube
                ) -> AsyncIterator[Any]:
    pki_dir = tmp_path / "agent-pki"
    aggapi_certs.generate(pki_dir)
    runners: list[web.AppRunner] = []

    async def start(agent: Agent) -> tuple[Server, aiohttp.ClientSession]:
        runner, port = await _agent(pki_dir, agent)
        runners.append(runner)
        srv = await relay_to_standin(make_server, kube, pki_dir, port)
        return srv, srv.session(srv.certs.client_pair(srv.certs.client_ca, "carol"))

    yield start
    for r in runners:
        await r.cleanup()


URL = f"{GV}/namespaces/default/pods/box/copy"
Q = {"container": "app", "path": "/tmp/f"}


@pytest.mark.parametrize("mode", ["length", "chunked", "tar"])
async def test_the_body_comes_through_unchanged(relay: Any, mode: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Into the relay's own buffers where it has a length or is a chunked tar.
    taken: list[bool] = []

    class Recorded(ResponseBody):
        def __init__(self, resp: aiohttp.ClientResponse) -> None:
            super().__init__(resp)
            taken.append(self.receiver is not None)

    monkeypatch.setattr(copy_handler, "ResponseBody", Recorded)
    agent = Agent(mode)
    _, s = await relay(agent)
    async with s.get(URL, params=Q, headers={"Range": "bytes=0-"}) as resp:
        assert resp.status == 200
        got = await resp.read()
        assert resp.headers["X-Aggapi-Sha256"] == "ab" * 32
        assert ("Content-Length" in resp.headers) == (mode == "length")
    assert got == BODY
    assert agent.heads[0]["Range"] == "bytes=0-"
    assert taken == [mode != "chunked"]


async def test_a_trailer_download_passes_through_with_its_range(relay: Any) -> None:
    """digest=trailer reaches the agent (not vouched for: it only frames the reply), and
    its 206 comes back byte for byte: Content-Range of the data, a Content-Length
    that counts the 32 digest bytes after it."""
    agent = Agent("trailer")
    _, s = await relay(agent)
    at = MiB + 5
    async with s.get(URL, params={**Q, "digest": "trailer", "symlink": "keep"},
                     headers={"Range": f"bytes={at}-"}) as resp:
        got = await resp.read()
        assert resp.status == 206 and resp.headers["X-Aggapi-Sha256"] == "trailer"
        assert resp.headers["Content-Range"] == f"bytes {at}-{len(BODY) - 1}/{len(BODY)}"
        assert int(resp.headers["Content-Length"]) == len(BODY) - at + 32
    assert got == BODY[at:] + hashlib.sha256(BODY).digest()
    assert agent.queries[0]["digest"] == "trailer" and agent.queries[0]["symlink"] == "keep"
    assert agent.heads[0]["Range"] == f"bytes={at}-"


async def test_an_agent_error_is_relayed_as_its_status(relay: Any) -> None:
    _, s = await relay(Agent("error"))
    async with s.get(URL, params=Q) as resp:
        status = await resp.json()
    assert resp.status == 404 and status["reason"] == "NotFound"
    assert status["message"] == "no such file"


@pytest.mark.parametrize("mode", ["die", "short", "tardie"])
async def test_an_agent_dying_mid_body_ends_the_download_after_the_bytes_it_sent(
        relay: Any, mode: str) -> None:
    _, s = await relay(Agent(mode))
    got = bytearray()
    with pytest.raises(aiohttp.ClientPayloadError):  # not a wait for the rest, forever
        async with asyncio.timeout(20), s.get(URL, params=Q) as resp:
            assert resp.status == 200
            async for chunk, _ in resp.content.iter_chunks():
                got += chunk
    # What it sent, as far as it came through before the cut: the client resumes there.
    assert len(got) > 0 and BODY.startswith(bytes(got))


async def test_a_client_gone_mid_body_closes_the_agents_connection(relay: Any) -> None:
    agent = Agent("stall")
    _, s = await relay(agent)
    resp = await s.get(URL, params=Q)
    assert len(await resp.content.readexactly(MiB)) == MiB
    resp.close()  # the client hangs up while the relay waits on the agent
    await asyncio.wait_for(agent.gone.wait(), 10)

