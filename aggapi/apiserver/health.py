"""/healthz, /livez and /readyz (no authentication: probes must not need the control plane)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.authconfig import AuthConfigSource
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.status import Handler


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def readyz(auth_source: AuthConfigSource, lifecycle: Lifecycle,
           agent: AgentClient | None,
           collections: Callable[[], bool] | None = None) -> Handler:
    """Ready once the authentication config is loaded, the agents' endpoints are known
    and the collections were built (``collections``: ``Feeds.complete``); not while draining."""

    async def ready(request: web.Request) -> web.StreamResponse:
        checks = [
            ("authentication-config", auth_source.ready.is_set()),
            ("shutdown", not lifecycle.draining.is_set()),
        ]
        if collections is not None:
            checks.append(("collections", collections()))
        if agent is not None:
            checks.append(("agent-endpoints", agent.directory.synced))
            checks.append(("token-key", agent.key_published))
        ok = all(passed for _, passed in checks)
        if "verbose" not in request.query:
            return web.Response(text="ok" if ok else "not ready", status=200 if ok else 503)
        lines = [f"[{'+' if passed else '-'}]{name} {'ok' if passed else 'failed'}"
                 for name, passed in checks]
        lines.append("readyz check passed" if ok else "readyz check failed")
        return web.Response(text="\n".join(lines) + "\n", status=200 if ok else 503)

    return ready
