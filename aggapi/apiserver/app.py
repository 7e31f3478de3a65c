"""The apiserver's aiohttp application: middlewares in request order, then routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from aggapi import GROUP, VERSION
from aggapi.apiserver import appkeys, discovery, health, openapi
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.agents import AgentDirectory
from aggapi.apiserver.authconfig import AuthConfig, AuthConfigSource, parse_certs
from aggapi.apiserver.authn import Authenticator, TokenReviewer, authn_middleware
from aggapi.apiserver.authz import Authorizer, authz_middleware
from aggapi.apiserver.config import ApiServerConfig
from aggapi.apiserver.handlers import copy, imagepullprogress
from aggapi.apiserver.metrics import Metrics, metrics_handler, metrics_middleware
from aggapi.apiserver.podwatch import PodWatchHub
from aggapi.apiserver.requestinfo import requestinfo_middleware
from aggapi.apiserver.shutdown import Lifecycle, on_shutdown
from aggapi.capability import CapabilitySigner
from aggapi.kube import KubeClient
from aggapi.logs import audit_id_middleware
from aggapi.status import status_middleware
from aggapi.tlsconfig import ServingTLS

log = logging.getLogger(__name__)

GV = f"/apis/{GROUP}/{VERSION}"
POD = "/namespaces/{namespace}/pods/{name}"


def _routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/healthz", health.healthz)
    r.add_get("/livez", health.healthz)
    r.add_get("/readyz", health.readyz)
    r.add_get("/metrics", metrics_handler)
    r.add_get("/apis", discovery.apis)
    r.add_get(f"/apis/{GROUP}", discovery.group)
    r.add_get(GV, discovery.group_version)
    r.add_get("/openapi/v2", openapi.openapi_v2)
    r.add_get("/openapi/v3", openapi.openapi_v3_discovery)
    r.add_get(f"/openapi/v3/{openapi.V3_PATH}", openapi.openapi_v3_group_version)
    # Each subresource also under /watch/: kube-apiserver then treats it as
    # long-running (verb watch) and does not cut it at --request-timeout.
    for prefix in (GV, f"{GV}/watch"):
        r.add_get(f"{prefix}{POD}/imagepullprogress", imagepullprogress.pod_progress)
        r.add_get(f"{prefix}{POD}/copy", copy.copy)  # add_get also answers HEAD
        r.add_post(f"{prefix}{POD}/copy", copy.copy)
    r.add_get(GV + "/nodes/{name}/imagepulls", imagepullprogress.node_pulls)


async def _background(app: web.Application) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(app[appkeys.AUTH_SOURCE].run(), name="auth-config")]
    tls = app[appkeys.TLS]
    if tls is not None:
        tasks.append(asyncio.create_task(tls.run(), name="tls-reload"))
    agent = app[appkeys.AGENT_CLIENT]
    if agent is not None:
        agent.directory.start()
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await app[appkeys.PROGRESS_STREAMS].close()
    await app[appkeys.POD_WATCHES].close()
    if agent is not None:
        await agent.directory.stop()
        await agent.close()


def _agent_client(config: ApiServerConfig, kube_api: KubeClient) -> AgentClient | None:
    files = (config.agent_ca_file, config.agent_client_cert_file,
             config.agent_client_key_file, config.token_signing_key_file)
    if not all(files):
        if any(files):
            raise SystemExit("--agent-ca-file, --agent-client-cert-file, "
                             "--agent-client-key-file and --token-signing-key-file go together")
        log.warning("no agent credentials configured: the subresources will answer 503")
        return None
    directory = AgentDirectory(kube_api, namespace=config.agent_namespace,
                               service=config.agent_service, port_name=config.agent_port_name)
    signer = CapabilitySigner(Path(config.token_signing_key_file).read_bytes())
    return AgentClient(directory, signer, ca_file=config.agent_ca_file,
                       cert_file=config.agent_client_cert_file,
                       key_file=config.agent_client_key_file)


def build_app(config: ApiServerConfig, *, kube_api: KubeClient,
              tls: ServingTLS | None = None,
              auth_source: AuthConfigSource | None = None) -> web.Application:
    """The application; ``kube_api`` stays the caller's to close."""
    app = web.Application(middlewares=[
        audit_id_middleware,     # Audit-ID on every log line
        requestinfo_middleware,  # verb/resource/... from method and path
        metrics_middleware,      # sees the final code, Status errors included
        status_middleware,       # every error below becomes a metav1.Status
        authn_middleware,
        authz_middleware,
    ])
    metrics = Metrics()
    source = auth_source or AuthConfigSource(kube_api, config.auth_configmap_namespace,
                                             config.auth_configmap_name)
    extra_cas = parse_certs(Path(config.client_ca_file).read_bytes(), config.client_ca_file) \
        if config.client_ca_file else ()
    tokens = TokenReviewer(kube_api, metrics, ttl=config.authn_cache_ttl,
                           maxsize=config.authn_cache_size, timeout=config.review_timeout)
    app[appkeys.CONFIG] = config
    app[appkeys.KUBE_API] = kube_api
    app[appkeys.METRICS] = metrics
    app[appkeys.AUTH_SOURCE] = source
    app[appkeys.AUTHENTICATOR] = Authenticator(source, tokens, metrics,
                                               anonymous_enabled=config.anonymous_auth,
                                               extra_client_cas=extra_cas)
    app[appkeys.AUTHORIZER] = Authorizer(kube_api, metrics, allow_ttl=config.authz_allow_ttl,
                                         deny_ttl=config.authz_deny_ttl,
                                         maxsize=config.authz_cache_size,
                                         timeout=config.review_timeout)
    lifecycle = Lifecycle()
    app[appkeys.LIFECYCLE] = lifecycle
    app[appkeys.SHUTDOWN] = lifecycle.shutdown
    app[appkeys.TLS] = tls
    app[appkeys.AGENT_CLIENT] = _agent_client(config, kube_api)
    app[appkeys.POD_WATCHES] = PodWatchHub(kube_api)
    app[appkeys.PROGRESS_STREAMS] = imagepullprogress.new_progress_streams()
    if tls is not None:
        extra_pem = Path(config.client_ca_file).read_bytes() if config.client_ca_file else b""

        async def _cas_changed(cfg: AuthConfig) -> None:
            # Only used when the handshake itself must verify (no libssl callback).
            await tls.set_client_cas([cfg.client_ca_pem, cfg.requestheader_ca_pem, extra_pem])

        source.subscribe(_cas_changed)
    app.cleanup_ctx.append(_background)
    app.on_shutdown.append(on_shutdown)
    _routes(app)
    return app
