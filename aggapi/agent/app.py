"""The agent's composition root: its parts are built here, once, and handed in.

In the spirit of the generic apiserver's Config -> Complete() -> New():
:class:`~aggapi.agent.config.AgentConfig` is the config; :func:`connect` opens
the runtime clients and reads the token key (production), :func:`new_parts`
builds the engines from given clients (tests pass fakes); :func:`build_app`
wires routes, middlewares and lifecycle hooks, handing each handler object the
parts it uses. No module below this one looks its dependencies up in the app.

Middlewares, outermost first: Status errors, metrics, auth (mTLS CN +
capability token, see aggapi.agent.auth). Besides that mTLS app, the agent
serves probes (plain HTTP, :func:`build_health_app`) and Prometheus, only on
its own port (:func:`build_metrics_app`: HTTPS, a bearer token checked by
TokenReview and SubjectAccessReview, see aggapi.auth.delegated).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Middleware

from aggapi import wire
from aggapi.agent import pullmetrics
from aggapi.agent.auth import SandboxLister, auth_middleware
from aggapi.agent.config import AgentConfig
from aggapi.agent.copy import engine as copy_engine
from aggapi.agent.copy import fastuntar
from aggapi.agent.copy.handlers import CopyHandlers
from aggapi.agent.copy.send import bytes_sent
from aggapi.agent.copy.state import CopyState, Resolver
from aggapi.agent.health import Check, ReadinessChecks, livez, readyz
from aggapi.agent.kubeletconfig import KubeletConfigReader
from aggapi.agent.metrics import AgentMetrics
from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.cri_backend import CRIBackend
from aggapi.agent.progress.handlers import ProgressHandlers
from aggapi.agent.progress.linkticks import LinkTicks
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.agent.progress.peerroute import PeerRoute
from aggapi.agent.progress.poller import Backend, ProgressPoller
from aggapi.agent.progress.sockbytes import SocketBytes
from aggapi.agent.pullmetrics import PullTracker
from aggapi.auth.agentidentity import Identity, IdentityPublisher
from aggapi.auth.capability import CapabilityVerifier
from aggapi.auth.delegated import AccessReviewer, TokenReviewer, nonresource_guard
from aggapi.auth.tokenkeys import KeyWatch
from aggapi.kube.client import KubeClient, load_client
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient
from aggapi.serve.drain import Drain, Handler
from aggapi.status import status_middleware

log = logging.getLogger(__name__)


@dataclass
class AgentParts:
    """Everything the agent's handlers and middlewares use."""

    config: AgentConfig
    cri: CRIClient
    # None on runtimes without a containerd content store (CRI-O): phases only.
    containerd: ContainerdClient | None
    verifier: CapabilityVerifier
    poller: ProgressPoller
    pull_limits: KubeletConfigReader
    copy: CopyState
    metrics: AgentMetrics
    readiness: ReadinessChecks
    # The metrics port's TokenReviews and SubjectAccessReviews go here (the agent's
    # ServiceAccount: system:auth-delegator, and reading the published token keys);
    # None when neither delegated metrics auth nor --token-key-set needs it.
    kube: KubeClient | None = None
    # The apiserver replicas' published verification keys (--token-key-set); None
    # with a fixed key file.
    token_keys: KeyWatch | None = None
    # Publishes this agent's in-memory serving identity (--identity-key-set).
    identity: IdentityPublisher | None = None
    # Copies in flight at SIGTERM, and the refusal of new ones (aggapi/agent/main.py).
    drain: Drain = field(default_factory=Drain)
    # containerd's received bytes at wall-clock ticks, for the leader's link judgement
    # (None without a containerd backend).
    ticks: LinkTicks | None = None

    async def close_clients(self) -> None:
        """Close the runtime and API connections (after the apps are cleaned up)."""
        await self.cri.close()
        if self.containerd is not None:
            await self.containerd.close()
        if self.kube is not None:
            await self.kube.close()


# The parts of a built app, for tests and benchmarks that look inside a running
# agent; the agent's own modules are handed their parts instead.
PARTS: web.AppKey[AgentParts] = web.AppKey("agent_parts", AgentParts)


def make_backend(config: AgentConfig, cri: CRIClient,
                 containerd: ContainerdClient | None) -> Backend:
    if containerd is None:
        return CRIBackend(cri)
    platform = Platform.parse(config.platform) if config.platform else Platform.host()
    received = SocketBytes(config.containerd_address)
    return ContainerdBackend(containerd, platform, snapshotter=config.snapshotter,
                             received=received.read)


def runtime_checks(cri: CRIClient, containerd: ContainerdClient | None,
                   token_keys: KeyWatch | None = None,
                   identity: IdentityPublisher | None = None) -> ReadinessChecks:
    """/readyz asks CRI's Version and, unless CRI-only, containerd's Version service;
    with published token keys, also that they have been listed."""
    # Looked up per call: test fakes of the clients need not answer probes.
    checks: list[tuple[str, Check]] = [("cri", lambda: cri.version())]
    if containerd is not None:
        checks.append(("containerd", lambda: containerd.version()))
    if token_keys is not None:
        checks.append(("token-keys", token_keys.check))
    if identity is not None:
        checks.append(("identity", identity.check))
    return ReadinessChecks(checks)


def new_parts(config: AgentConfig, *, cri: CRIClient, containerd: ContainerdClient | None,
              verifier: CapabilityVerifier, backend: Backend | None = None,
              copy_resolver: Resolver | None = None, kube: KubeClient | None = None,
              token_keys: KeyWatch | None = None,
              identity: IdentityPublisher | None = None) -> AgentParts:
    """The engines over given runtime clients. ``backend`` replaces the progress
    backend and ``copy_resolver`` the CRI container lookup (tests and benchmarks);
    ``kube`` answers the metrics port's reviews."""
    metrics = AgentMetrics()
    backend = backend or make_backend(config, cri, containerd)
    poller = ProgressPoller(backend, config.poll_interval, on_poll=metrics.observe_poll)
    metrics.bind(subscribers=lambda: poller.subscribers,
                 runtime_calls=lambda: getattr(containerd, "rpc_count", 0), sent=bytes_sent)
    return AgentParts(config=config, cri=cri, containerd=containerd, verifier=verifier,
                      poller=poller, pull_limits=KubeletConfigReader(config.kubelet_config),
                      copy=copy_engine.new_state(config.copy, cri, copy_resolver,
                                                as_root=config.copy_as_root),
                      metrics=metrics,
                      readiness=runtime_checks(cri, containerd, token_keys, identity),
                      kube=kube, token_keys=token_keys, identity=identity,
                      ticks=link_ticks(config, backend))


def link_ticks(config: AgentConfig, backend: Backend) -> LinkTicks | None:
    """Ticks read while the containerd backend's layers download (its received-bytes
    meter then has samples), with a counter of their own (reads from two threads)."""
    if not isinstance(backend, ContainerdBackend):
        return None
    meter = backend.link.received
    return LinkTicks(SocketBytes(config.containerd_address).read, lambda: bool(meter.samples))


async def connect(config: AgentConfig, identity: Identity | None = None) -> AgentParts:
    """The production parts: the node's runtime sockets, and the token key from disk or
    the watch of the apiserver replicas' published keys."""
    # Which tar upload loop this image runs (its compiled one is optional).
    log.info("copy extraction", extra={"path": fastuntar.describe()})
    kube = None
    if config.token_key_set or identity is not None or (
            config.metrics_port and config.metrics_auth == "delegated"):
        kube = await load_client(config.kubeconfig or None)
    token_keys = None
    if config.token_key_set:
        assert kube is not None
        token_keys = KeyWatch(kube, namespace=config.token_key_namespace,
                              key_set=config.token_key_set)
        verifier = CapabilityVerifier(None, config.node_name, issuer=config.token_issuer,
                                      keys=token_keys.keys)
    else:
        key = await asyncio.to_thread(Path(config.token_public_key).read_bytes)
        verifier = CapabilityVerifier(key, config.node_name, issuer=config.token_issuer)
    cri = CRIClient(config.cri_address)
    containerd = (ContainerdClient(config.containerd_address, config.containerd_namespace)
                  if config.runtime == "containerd" else None)
    publisher = None
    if identity is not None:
        assert kube is not None
        publisher = IdentityPublisher(kube, identity, node=config.node_name,
                                      key_set=config.identity_key_set)
    return new_parts(config, cri=cri, containerd=containerd, verifier=verifier, kube=kube,
                     token_keys=token_keys, identity=publisher)


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def build_app(parts: AgentParts, *, pod_check: SandboxLister | bool | None = True
              ) -> web.Application:
    """``pod_check``: True checks tokens' pods against CRI sandboxes; a lister to use
    instead; False/None to skip (only for tests of other concerns)."""
    config = parts.config
    lister: SandboxLister | None = parts.cri if pod_check is True else (pod_check or None)
    app = web.Application(middlewares=[
        status_middleware,
        parts.metrics.middleware,
        auth_middleware(parts.verifier, config.allowed_client_cns, wire.AGENT_OPERATIONS,
                        cri=lister, tls_only=("/healthz", "/livez", "/readyz")),
        drain_copies(parts.drain),
    ])
    app[PARTS] = parts
    progress = ProgressHandlers(parts.poller, parts.pull_limits, config.node_name, parts.ticks)
    copy_api = CopyHandlers(parts.copy)

    app.router.add_get(wire.AGENT_PROGRESS_PATH, progress.imagepullprogress,
                       allow_head=False)
    app.router.add_get(wire.AGENT_NODE_PULLS_PATH, progress.imagepulls, allow_head=False)
    app.router.add_put(wire.AGENT_LINK_PEERS_PATH, PeerRoute(parts.poller).put)
    app.router.add_route("HEAD", wire.AGENT_COPY_PATH, copy_api.stat)
    app.router.add_get(wire.AGENT_COPY_PATH, copy_api.download, allow_head=False)
    app.router.add_post(wire.AGENT_COPY_PATH, copy_api.upload)
    add_probes(app, parts)
    # No /metrics here: only the apiserver's client certificate reaches this port, and
    # Prometheus has none; metrics are on the metrics port (build_metrics_app) alone.

    tasks: list[asyncio.Task[None]] = []

    async def start(_app: web.Application) -> None:
        if parts.token_keys is not None:
            parts.token_keys.start()
        if parts.identity is not None:
            tasks.append(asyncio.create_task(parts.identity.run(), name="agent-identity"))
        if parts.ticks is not None:
            tasks.append(asyncio.create_task(parts.ticks.run(), name="agent-link-ticks"))
        await copy_engine.startup(parts.copy)

    async def stop(_app: web.Application) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if parts.token_keys is not None:
            await parts.token_keys.stop()
        await parts.poller.close()
        copy_engine.shutdown(parts.copy)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app


def drain_copies(drain: Drain) -> Middleware:
    """Copies go through the drain: refused once the agent stops, ended early when they
    cannot finish before it does (aggapi/serve/drain.py)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != wire.AGENT_COPY_PATH:
            return await handler(request)
        return await drain.run(request, handler)

    return middleware


def add_probes(app: web.Application, parts: AgentParts) -> None:
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/livez", livez, allow_head=False)
    drain = parts.drain
    app.router.add_get("/readyz", readyz(parts.readiness, draining=lambda: drain.draining),
                       allow_head=False)


def build_health_app(parts: AgentParts) -> web.Application:
    """Plain-HTTP probes for the kubelet (it presents no client certificate)."""
    app = web.Application()
    add_probes(app, parts)
    return app


def build_metrics_app(parts: AgentParts) -> web.Application:
    """/metrics for Prometheus: with ``--metrics-auth=delegated`` a bearer token the
    TokenReview accepts, then a SubjectAccessReview for ``get`` on ``/metrics``."""
    middlewares: list[Middleware] = [status_middleware]
    if parts.config.metrics_auth == "delegated":
        if parts.kube is None:
            raise ValueError("delegated metrics authentication needs a Kubernetes client")
        middlewares.append(nonresource_guard(TokenReviewer(parts.kube, parts.metrics),
                                             AccessReviewer(parts.kube, parts.metrics)))
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", parts.metrics.handler, allow_head=False)
    # Served metrics include the node's pulls: follow them while the port is up.
    tracker = PullTracker(parts.metrics, stall_after=parts.config.pull_stall_seconds)
    app.cleanup_ctx.append(pullmetrics.following(parts.poller, tracker,
                                                 parts.pull_limits.limits))
    return app
