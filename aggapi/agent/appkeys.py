"""Typed keys of the agent's aiohttp application and requests, shared by its modules.

The agent app (aggapi.agent.app) fills these at start-up; handlers read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from aggapi.agent.config import AgentConfig
    from aggapi.agent.kubeletconfig import KubeletConfigReader
    from aggapi.agent.metrics import AgentMetrics
    from aggapi.agent.progress.poller import ProgressPoller
    from aggapi.capability import Capability
    from aggapi.runtime.containerd import ContainerdClient
    from aggapi.runtime.cri import CRIClient

CONFIG: web.AppKey[AgentConfig] = web.AppKey("config", object)  # type: ignore[arg-type]
CRI: web.AppKey[CRIClient] = web.AppKey("cri", object)  # type: ignore[arg-type]
# None on runtimes without a containerd content store (CRI-O): degraded mode.
CONTAINERD: web.AppKey[ContainerdClient | None] = web.AppKey("containerd", object)  # type: ignore[arg-type]
# Copy quotas and per-feature state, owned by aggapi.agent.copy.
COPY_STATE: web.AppKey[Any] = web.AppKey("copy_state", object)

# Per request: the verified aggapi.capability.Capability (set by the auth middleware).
CAPABILITY: web.RequestKey[Capability] = web.RequestKey("capability", object)  # type: ignore[arg-type]

# Progress engine (aggapi.agent.progress): the node's shared poller, kubelet limits, metrics.
POLLER: web.AppKey[ProgressPoller] = web.AppKey("progress_poller", object)  # type: ignore[arg-type]
PULL_LIMITS: web.AppKey[KubeletConfigReader] = web.AppKey("pull_limits", object)  # type: ignore[arg-type]
METRICS: web.AppKey[AgentMetrics] = web.AppKey("metrics", object)  # type: ignore[arg-type]
