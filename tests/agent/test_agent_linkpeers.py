"""PUT /v1/linkpeers on the real agent app over mTLS: the leader's word on the other
nodes' pulls on this node's link is taken only as every apiserver call is (client
certificate, capability token for this node and this operation), and only whole and
well formed (issue 37 item 3)."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest

from aggapi import wire
from aggapi.agent.app import PARTS
from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.peerroute import MAX_BODY
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentEndpoint
from aggapi.apiserver.collections.linkfeed import LinkFeeder
from aggapi.linkpeers import PeerLink, PeerPull
from tests.agent.agentserver import NODE, Agent, client_ssl, fake_runtime_agent

BODY = {"peers": {"node-b": [{"remaining": 3e6, "bytesPerSecond": 1.6e5}]}, "total": 4e5}


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with fake_runtime_agent(tmp_path) as a:
        yield a


def _told(agent: Agent) -> PeerLink | None:
    backend = agent.app[PARTS].poller.backend
    assert isinstance(backend, ContainerdBackend)
    book = backend.link.peers
    # As it came (current() counts a word's bytes left down from then), if still fresh.
    return None if book.current(time.time()) is None else book.current(book.at)


async def _put(agent: Agent, body: Any, token: str | None, *,
               ssl_ctx: ssl.SSLContext | None = None) -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as s, s.put(
            agent.url + wire.AGENT_LINK_PEERS_PATH, data=data, headers=headers,
            ssl=ssl_ctx or client_ssl(agent.pki)) as resp:
        return resp.status, await resp.text()


def _token(agent: Agent, op: str = wire.OP_LINK_PEERS, node: str = "node-a") -> str:
    return agent.signer.sign(node=node, subject="aggapi:collections", operation=op)


async def test_the_leaders_word_is_kept_for_the_planner(agent: Agent) -> None:
    status, text = await _put(agent, BODY, _token(agent))
    assert status == 204, text
    assert _told(agent) == PeerLink({"node-b": (PeerPull(3e6, 1.6e5),)}, 4e5)


@pytest.mark.parametrize("why", ["no token", "other node", "other operation", "no cert"])
async def test_only_the_apiserver_for_this_node_may_tell(agent: Agent, why: str) -> None:
    token = {"no token": None, "other node": _token(agent, node="node-b"),
             "other operation": _token(agent, wire.OP_NODE_PULLS),
             "no cert": _token(agent)}[why]
    if why == "no cert":  # refused at the TLS handshake already
        with pytest.raises(aiohttp.ClientError):
            await _put(agent, BODY, token, ssl_ctx=client_ssl(agent.pki, cert=False))
    else:
        status, _ = await _put(agent, BODY, token)
        assert status in (401, 403), why
    assert _told(agent) is None


@pytest.mark.parametrize("body", [
    b"not json", b"[" * 100_000, {"peers": {"n": [{"remaining": -1, "bytesPerSecond": 1}]}},
    {"peers": {f"n{i}": [] for i in range(100)}}, b"{" + b" " * (MAX_BODY + 1) + b"}",
])
async def test_garbage_is_refused_whole(agent: Agent, body: Any) -> None:
    await _put(agent, BODY, _token(agent))
    before = _told(agent)
    status, text = await _put(agent, body, _token(agent))
    assert status in (400, 413), text
    assert json.loads(text)["kind"] == "Status"
    assert _told(agent) == before  # the last good word stands


async def test_the_leaders_client_sends_what_the_agent_keeps(agent: Agent) -> None:
    """The leader's own path: AgentClient (client certificate, capability signed for the
    node) from LinkFeeder.send to the real route."""
    ep = AgentEndpoint(NODE, "127.0.0.1", int(agent.url.rsplit(":", 1)[1]))

    class _Dir:
        async def endpoint(self, node: str) -> AgentEndpoint:
            return ep

    client = AgentClient(cast(Any, _Dir()), agent.signer, ca_file=str(agent.pki / "ca.crt"),
                         cert_file=str(agent.pki / "agent-client.crt"),
                         key_file=str(agent.pki / "agent-client.key"))
    try:
        feeder = LinkFeeder(client, cast(Any, None))
        link = PeerLink({"node-b": (PeerPull(3e6, 1.6e5),)}, 4e5)
        await feeder.send(NODE, link)
        assert _told(agent) == link
    finally:
        await client.close()
