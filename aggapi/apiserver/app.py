"""The apiserver's aiohttp application ("New"): middlewares in request order, the
route table, and the background tasks, each handed the parts it uses."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from aggapi.apiserver.authconfig import AuthConfigSource
from aggapi.apiserver.authn import authn_middleware
from aggapi.apiserver.authz import authz_middleware
from aggapi.apiserver.config import ApiServerConfig
from aggapi.apiserver.election import Election
from aggapi.apiserver.metrics import metrics_middleware
from aggapi.apiserver.parts import Parts, complete
from aggapi.apiserver.requestinfo import requestinfo_middleware
from aggapi.apiserver.routes import Route, install, route_table
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.kube.client import KubeClient
from aggapi.serve.logs import audit_id_middleware
from aggapi.status import status_middleware
from aggapi.tls.serving import ServingTLS


def _background(parts: Parts) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(_app: web.Application) -> AsyncIterator[None]:
        tasks = [asyncio.create_task(parts.auth_source.run(), name="auth-config")]
        if parts.tls is not None:
            tasks.append(asyncio.create_task(parts.tls.run(), name="tls-reload"))
        agent = parts.agent
        if agent is not None:
            agent.directory.start()
            if agent.pins is not None:
                agent.pins.start()
            if agent.key_publisher is not None:
                tasks.append(asyncio.create_task(agent.key_publisher.run(),
                                                 name="token-key"))
        tasks.append(asyncio.create_task(parts.election.run(), name="leader-election"))
        if not parts.config.leader_elect:
            parts.feeds.lead()  # alone: this replica leads from the start
        tasks.append(asyncio.create_task(parts.link_hold.run(), name="link-hold"))
        yield
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if parts.mirror is not None:
            await parts.mirror.close()
        if parts.forwarder is not None:
            await parts.forwarder.close()
        await parts.progress_streams.close()
        parts.fleet.close()
        await parts.feeds.close()  # and the pod/event sources the streams shared
        if agent is not None:
            await agent.directory.stop()
            if agent.pins is not None:
                await agent.pins.stop()
            await agent.close()

    return run


# The app's draining/shutdown state, for the process that serves it (main.serve).
LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
# Its election, for the hand-over at SIGTERM (main.serve), while it still accepts.
ELECTION = web.AppKey("election", Election)


def new_app(parts: Parts, *, extra_routes: list[Route] | None = None) -> web.Application:
    """The application serving ``parts``; ``extra_routes`` are for tests."""
    app = web.Application()
    authz_of = install(app.router, route_table(parts) + (extra_routes or []))
    app.middlewares.extend([
        audit_id_middleware,                 # Audit-ID on every log line
        metrics_middleware(parts.metrics),   # sees the final code, Status errors included
        status_middleware,                   # every error below becomes a metav1.Status
        requestinfo_middleware,              # the one parse: 400 for ambiguous segments
        authn_middleware(parts.authenticator),
        authz_middleware(parts.authorizer, authz_of),  # what the route table declares
    ])
    app.cleanup_ctx.append(_background(parts))
    app[LIFECYCLE] = parts.lifecycle
    app[ELECTION] = parts.election

    async def on_shutdown(_app: web.Application) -> None:
        # Another replica leads the collections at once (not when the Lease expires),
        # so the watches this drain ends find the new term when they come back.
        await parts.election.release()
        await parts.lifecycle.drain(parts.config.shutdown_grace)

    app.on_shutdown.append(on_shutdown)
    return app


def build_app(config: ApiServerConfig, *, kube_api: KubeClient,
              tls: ServingTLS | None = None,
              auth_source: AuthConfigSource | None = None,
              on_warm: Callable[[], None] | None = None) -> web.Application:
    """The application; ``kube_api`` stays the caller's to close. ``on_warm``: called
    each time a term's warm feed is built or a follower's mirror syncs (the process's,
    not a test's, GC freeze)."""
    return new_app(complete(config, kube_api=kube_api, tls=tls, auth_source=auth_source,
                            on_warm=on_warm))
