"""The agent's aiohttp application: routes, middlewares, shared state.

Middlewares, outermost first: Status errors, metrics, auth (mTLS CN +
capability token, see aggapi.agent.auth). The copy routes come from
aggapi.agent.copy.handlers when that package provides them.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from aggapi import wire
from aggapi.agent import appkeys
from aggapi.agent.auth import SandboxLister, auth_middleware
from aggapi.agent.config import AgentConfig
from aggapi.agent.kubeletconfig import KubeletConfigReader
from aggapi.agent.metrics import AgentMetrics
from aggapi.agent.progress import handlers as progress_api
from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.cri_backend import CRIBackend
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.agent.progress.poller import Backend, ProgressPoller
from aggapi.capability import CapabilityVerifier
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from aggapi.status import status_middleware

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_backend(config: AgentConfig, cri: CRIClient,
                 containerd: ContainerdClient | None) -> Backend:
    if containerd is None:
        return CRIBackend(cri)
    platform = Platform.parse(config.platform) if config.platform else Platform.host()
    return ContainerdBackend(containerd, platform, snapshotter=config.snapshotter)


def _add_copy(app: web.Application, operations: dict[tuple[str, str], str]) -> None:
    """Copy routes and start-up hook, if aggapi.agent.copy provides them (its own
    import errors are not hidden: only a missing module is tolerated)."""
    if importlib.util.find_spec("aggapi.agent.copy") is None:
        return
    pkg = importlib.import_module("aggapi.agent.copy")
    startup = getattr(pkg, "startup", None)
    if callable(startup):
        async def on_startup(a: web.Application) -> None:
            result = startup(a)
            if inspect.isawaitable(result):
                await result
        app.on_startup.append(on_startup)
    if importlib.util.find_spec("aggapi.agent.copy.handlers") is None:
        log.warning("aggapi.agent.copy.handlers is missing: copy routes are not served")
        for key in [k for k in operations if k[1] == "/v1/copy"]:
            del operations[key]
        return
    handlers = importlib.import_module("aggapi.agent.copy.handlers")
    app.router.add_route("HEAD", "/v1/copy", handlers.stat)
    app.router.add_get("/v1/copy", handlers.download, allow_head=False)
    app.router.add_post("/v1/copy", handlers.upload)


def build_app(config: AgentConfig, *, cri: CRIClient, containerd: ContainerdClient | None,
              verifier: CapabilityVerifier, backend: Backend | None = None,
              pod_check: SandboxLister | bool | None = True) -> web.Application:
    """``pod_check``: True checks tokens' pods against CRI sandboxes; a lister to use
    instead; False/None to skip (only for tests of other concerns)."""
    operations = dict(wire.AGENT_OPERATIONS)
    metrics = AgentMetrics()
    lister: SandboxLister | None = cri if pod_check is True else (pod_check or None)
    app = web.Application(middlewares=[
        status_middleware,
        metrics.middleware,
        auth_middleware(verifier, config.allowed_client_cns, operations, cri=lister),
    ])
    poller = ProgressPoller(backend or make_backend(config, cri, containerd),
                            config.poll_interval)
    app[appkeys.CONFIG] = config
    app[appkeys.CRI] = cri
    app[appkeys.CONTAINERD] = containerd
    app[appkeys.POLLER] = poller
    app[appkeys.PULL_LIMITS] = KubeletConfigReader(config.kubelet_config)
    app[appkeys.METRICS] = metrics
    metrics.bind(subscribers=lambda: poller.subscribers, polls=lambda: poller.polls,
                 poll_seconds=lambda: poller.last_poll_seconds,
                 runtime_calls=lambda: getattr(containerd, "rpc_count", 0))

    app.router.add_get("/v1/imagepullprogress", progress_api.imagepullprogress,
                       allow_head=False)
    app.router.add_get("/v1/imagepulls", progress_api.imagepulls, allow_head=False)
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/metrics", metrics.handler, allow_head=False)
    _add_copy(app, operations)

    async def close_poller(_app: web.Application) -> None:
        await poller.close()

    app.on_cleanup.append(close_poller)
    return app


def build_health_app() -> web.Application:
    """Plain-HTTP /healthz for kubelet probes (they present no client certificate)."""
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    return app
