"""Request handlers of the subresources; helpers they share.

Handlers get their parts at construction and act on the request's one parsed
``RequestInfo``; they do no authorization (that is the authz layer's, from the
route table).
"""

from __future__ import annotations

from aggapi.apiserver.agentclient import AgentClient
from aggapi.status import StatusError


def require_agent(agent: AgentClient | None) -> AgentClient:
    """The client for node agents, or a 503 when this server was started without one."""
    if agent is None:
        raise StatusError(503, "aggapi is not configured to reach node agents "
                               "(--agent-* and --token-signing-key-file)", retry_after=30)
    return agent
