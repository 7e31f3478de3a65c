"""Typed keys of the apiserver's aiohttp application and requests, in one place."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from aggapi.apiserver.user import UserInfo
from aggapi.kube import KubeClient

if TYPE_CHECKING:
    from aggapi.apiserver.agentclient import AgentClient
    from aggapi.apiserver.authconfig import AuthConfigSource
    from aggapi.apiserver.authn import Authenticator
    from aggapi.apiserver.authz import Authorizer
    from aggapi.apiserver.config import ApiServerConfig
    from aggapi.apiserver.fanout import SharedStreams
    from aggapi.apiserver.metrics import Metrics
    from aggapi.apiserver.podwatch import PodWatchHub
    from aggapi.apiserver.requestinfo import RequestInfo
    from aggapi.apiserver.shutdown import Lifecycle
    from aggapi.tlsconfig import ServingTLS

CONFIG: web.AppKey[ApiServerConfig] = web.AppKey("config", object)  # type: ignore[arg-type]
# Kubernetes API client for the cluster (owned by whoever built the app).
KUBE_API: web.AppKey[KubeClient] = web.AppKey("kube_api", KubeClient)
AUTH_SOURCE: web.AppKey[AuthConfigSource] = web.AppKey("auth_source", object)  # type: ignore[arg-type]
AUTHENTICATOR: web.AppKey[Authenticator] = web.AppKey("authenticator", object)  # type: ignore[arg-type]
# Handlers may make extra SubjectAccessReviews through it (cached like the rest).
AUTHORIZER: web.AppKey[Authorizer] = web.AppKey("authorizer", object)  # type: ignore[arg-type]
METRICS: web.AppKey[Metrics] = web.AppKey("metrics", object)  # type: ignore[arg-type]
# Draining / shutdown events and the in-flight stream count.
LIFECYCLE: web.AppKey[Lifecycle] = web.AppKey("lifecycle", object)  # type: ignore[arg-type]
# Set when streams must end now: write a final object and return.
SHUTDOWN: web.AppKey[asyncio.Event] = web.AppKey("shutdown", asyncio.Event)
# None when the app is served without TLS (unit tests of handlers).
TLS: web.AppKey[ServingTLS | None] = web.AppKey("tls", object)  # type: ignore[arg-type]

# Node agents (None when not configured: the subresources then answer 503).
AGENT_CLIENT: web.AppKey[AgentClient | None] = web.AppKey("agent_client", object)  # type: ignore[arg-type]
# Shared pod + event watches for streams.
POD_WATCHES: web.AppKey[PodWatchHub] = web.AppKey("pod_watches", object)  # type: ignore[arg-type]
# Progress streams shared by clients asking the same thing.
PROGRESS_STREAMS: web.AppKey[SharedStreams] = web.AppKey("progress_streams", object)  # type: ignore[arg-type]

# Per request, set by the authn middleware and the request-info middleware.
USER: web.RequestKey[UserInfo] = web.RequestKey("user", UserInfo)
INFO: web.RequestKey[RequestInfo] = web.RequestKey("info", object)  # type: ignore[arg-type]
