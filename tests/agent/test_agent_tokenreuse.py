"""The leader's node-view polls over mTLS to the real agent app: one reusable token
serves many reads; an agent that takes each token once (one that predates reuse) gets
a fresh token per read after its first refusal, and the read it refused still
succeeds."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentEndpoint
from aggapi.apiserver.collections.nodepolls import POLL_SUBJECT
from aggapi.apiserver.imagepullprogress.nodeview import fetch_node_view
from aggapi.auth.capability import Capability, CapabilitySigner, CapabilityVerifier
from aggapi.status import StatusError
from tests.agent.agentserver import NODE, Agent, fake_runtime_agent


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with fake_runtime_agent(tmp_path) as a:
        yield a


class _Dir:
    def __init__(self, ep: AgentEndpoint) -> None:
        self.ep = ep

    async def endpoint(self, node: str) -> AgentEndpoint:
        return self.ep


def _client(agent: Agent, uid: str = "agent-pod-1") -> tuple[AgentClient, _Dir]:
    where = _Dir(AgentEndpoint(NODE, "127.0.0.1", int(agent.url.rsplit(":", 1)[1]),
                               pod_uid=uid))
    return AgentClient(cast(Any, where), agent.signer, ca_file=str(agent.pki / "ca.crt"),
                       cert_file=str(agent.pki / "agent-client.crt"),
                       key_file=str(agent.pki / "agent-client.key")), where


async def test_one_reusable_token_serves_the_polls(agent: Agent) -> None:
    client, _ = _client(agent)
    try:
        for _ in range(5):
            view = await fetch_node_view(client, NODE, POLL_SUBJECT, reuse=True)
            assert "pulls" in view
        assert client.reused.signed == 1
        # A user's read (nodes/imagepulls) still gets a token of its own, used once.
        await fetch_node_view(client, NODE, "alice")
        assert client.reused.signed == 1
    finally:
        await client.close()


async def test_an_agent_taking_each_token_once_gets_fresh_ones(
        agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    """As an agent before reuse: the claim ignored, every jti taken once."""
    plain = CapabilityVerifier._capability

    def old(self: CapabilityVerifier, c: Any) -> Capability:
        return dataclasses.replace(plain(self, c), reusable=False)

    monkeypatch.setattr(CapabilityVerifier, "_capability", old)
    client, where = _client(agent)
    try:
        for _ in range(4):  # the second read is refused once and made again, fresh
            await fetch_node_view(client, NODE, POLL_SUBJECT, reuse=True)
        assert client.reused.signed == 1  # no reusable token after the refusal
        where.ep = dataclasses.replace(where.ep, pod_uid="agent-pod-2")  # a new agent pod
        await fetch_node_view(client, NODE, POLL_SUBJECT, reuse=True)
        assert client.reused.signed == 2  # tried again
    finally:
        await client.close()


async def test_a_refused_first_use_is_the_callers_error(agent: Agent) -> None:
    """A reusable token refused at its first use (here: signed by a key the agent does
    not know) is an error as before, and forgotten: the next read signs a new one."""
    where = _Dir(AgentEndpoint(NODE, "127.0.0.1", int(agent.url.rsplit(":", 1)[1]),
                               pod_uid="agent-pod-1"))
    client = AgentClient(cast(Any, where), CapabilitySigner.generate(),
                         ca_file=str(agent.pki / "ca.crt"),
                         cert_file=str(agent.pki / "agent-client.crt"),
                         key_file=str(agent.pki / "agent-client.key"))
    try:
        for _ in range(2):
            with pytest.raises(StatusError) as err:
                await fetch_node_view(client, NODE, POLL_SUBJECT, reuse=True)
            assert err.value.code == 401
        assert client.reused.signed == 2 and len(client.reused) == 0
    finally:
        await client.close()
