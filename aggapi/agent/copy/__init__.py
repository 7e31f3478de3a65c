"""Safe copy into and out of running containers (KEP-4582), the agent side.

``startup(app)`` creates the shared :class:`CopyState` under
``appkeys.COPY_STATE`` and removes temp files a killed agent left behind;
``shutdown(app)`` stops the worker threads. The HTTP handlers are in
:mod:`aggapi.agent.copy.handlers`.
"""

from __future__ import annotations

import logging

from aiohttp import web

from aggapi.agent import appkeys
from aggapi.agent.copy.cleanup import cleanup_stale
from aggapi.agent.copy.container import CRIResolver
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.state import CopyState, Resolver
from aggapi.agent.copy.workers import Workers

log = logging.getLogger(__name__)

__all__ = ["CopyLimits", "CopyState", "Resolver", "shutdown", "startup"]


async def startup(app: web.Application, resolver: Resolver | None = None) -> None:
    """Create COPY_STATE (limits from AgentConfig's copy_* fields) and clean stale temps."""
    config = app[appkeys.CONFIG]
    limits = CopyLimits.from_config(config)
    workers = Workers()
    if resolver is None:
        as_root = bool(getattr(config, "copy_as_root", False))
        if as_root:
            log.warning("--copy-as-root: copies act as root, not as the container's user")
        resolver = CRIResolver(app[appkeys.CRI], workers, as_root=as_root)
    state = CopyState(limits, resolver, workers=workers)
    app[appkeys.COPY_STATE] = state
    try:
        removed = await cleanup_stale(limits.state_dir, resolver.by_id, workers,
                                      resolver.resolve)
        if removed:
            log.info("removed %d temp files left by an interrupted copy", removed)
    except OSError as exc:
        log.error("copy state dir %s unusable: %s", limits.state_dir, exc)


async def shutdown(app: web.Application) -> None:
    state = app.get(appkeys.COPY_STATE)
    if isinstance(state, CopyState):
        state.workers.shutdown()
