"""Request handlers of the subresources; helpers they share."""

from __future__ import annotations

from aiohttp import web

from aggapi.apiserver import appkeys
from aggapi.apiserver.agentclient import AgentClient
from aggapi.status import StatusError


def agent_client(request: web.Request) -> AgentClient:
    """The client for node agents, or a 503 when this server was started without one."""
    agent = request.app[appkeys.AGENT_CLIENT]
    if agent is None:
        raise StatusError(503, "aggapi is not configured to reach node agents "
                               "(--agent-* and --token-signing-key-file)", retry_after=30)
    return agent
