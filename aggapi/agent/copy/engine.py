"""The copy engine's lifecycle: build its state, clean up after a crash, stop.

The agent's composition root (aggapi.agent.app) builds one :class:`CopyState`
with :func:`new_state`, serves it through
:class:`aggapi.agent.copy.handlers.CopyHandlers`, runs :func:`startup` (removes
temp files a killed agent left behind) when the app starts and :func:`shutdown`
(stops the worker threads) when it is cleaned up.
"""

from __future__ import annotations

import logging

from aggapi.agent.copy.cleanup import cleanup_stale
from aggapi.agent.copy.container import CRIResolver
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.state import CopyState, Resolver
from aggapi.agent.copy.workers import Workers
from aggapi.runtime.cri import CRIClient

log = logging.getLogger(__name__)


def new_state(limits: CopyLimits, cri: CRIClient, resolver: Resolver | None = None, *,
              as_root: bool = False) -> CopyState:
    """The copy engine's state; containers are found through ``cri`` unless a
    ``resolver`` is given (tests and benchmarks use a plain directory). ``as_root``
    (--copy-as-root): copies act as root, not as the container process's user."""
    workers = Workers()
    if resolver is None:
        if as_root:
            log.warning("--copy-as-root: copies act as root, not as the container's user")
        resolver = CRIResolver(cri, workers, as_root=as_root)
    return CopyState(limits, resolver, workers=workers)


async def startup(state: CopyState) -> None:
    """Remove temp files that a killed agent left in containers."""
    try:
        removed = await cleanup_stale(state.limits.state_dir, state.resolver.by_id,
                                      state.workers, state.resolver.resolve)
        if removed:
            log.info("removed %d temp files left by an interrupted copy", removed)
    except OSError as exc:
        log.error("copy state dir %s unusable: %s", state.limits.state_dir, exc)


def shutdown(state: CopyState) -> None:
    """Stop the worker threads (queued work is cancelled; running calls finish)."""
    state.workers.shutdown()
