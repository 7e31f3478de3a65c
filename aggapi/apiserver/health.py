"""/healthz, /livez and /readyz (no authentication: probes must not need the control plane)."""

from __future__ import annotations

from aiohttp import web

from aggapi.apiserver import appkeys


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    app = request.app
    checks = [
        ("authentication-config", app[appkeys.AUTH_SOURCE].ready.is_set()),
        ("shutdown", not app[appkeys.LIFECYCLE].draining.is_set()),
    ]
    agent = app[appkeys.AGENT_CLIENT]
    if agent is not None:
        checks.append(("agent-endpoints", agent.directory.synced))
    ok = all(passed for _, passed in checks)
    if "verbose" not in request.query:
        return web.Response(text="ok" if ok else "not ready", status=200 if ok else 503)
    lines = [f"[{'+' if passed else '-'}]{name} {'ok' if passed else 'failed'}"
             for name, passed in checks]
    lines.append("readyz check passed" if ok else "readyz check failed")
    return web.Response(text="\n".join(lines) + "\n", status=200 if ok else 503)
