"""The copy engine's lifecycle: build its state, clean up after a crash, stop.

The agent's composition root (aggapi.agent.app) builds one :class:`CopyState`
with :func:`new_state`, serves it through
:class:`aggapi.agent.copy.handlers.CopyHandlers`, runs :func:`startup` (removes
temp files a killed agent left behind) when the app starts and :func:`shutdown`
(stops the worker threads) when it is cleaned up. Records that start-up could not
clean yet (an old agent still alive beside this one, a runtime that did not answer)
are retried in the background until they are gone.
"""

from __future__ import annotations

import asyncio
import logging

from aggapi.agent.copy.cleanup import CleanupPass, cleanup_stale
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
    workers = Workers(share=limits.namespace_share)
    if resolver is None:
        if as_root:
            log.warning("--copy-as-root: copies act as root, not as the container's user")
        resolver = CRIResolver(cri, workers, as_root=as_root)
    return CopyState(limits, resolver, workers=workers)


# Retrying what start-up could not clean: first after RETRY_FIRST s, doubling to RETRY_MAX.
RETRY_FIRST = 1.0
RETRY_MAX = 10.0


async def startup(state: CopyState) -> None:
    """Remove temp files that a killed agent left in containers (before serving), and
    come back for the records still locked or not yet resolvable."""
    done = await _clean(state)
    if done is not None and done.pending:
        state.cleanup_task = asyncio.create_task(_retry(state, done.pending))


async def _clean(state: CopyState, only: set[str] | None = None) -> CleanupPass | None:
    try:
        done = await cleanup_stale(state.limits.state_dir, state.resolver.by_id,
                                   state.workers, state.resolver.resolve, only)
    except OSError as exc:
        log.error("copy state dir %s unusable: %s", state.limits.state_dir, exc)
        return None
    if done.removed:
        log.info("removed %d temp files left by an interrupted copy", done.removed)
    return done


async def _retry(state: CopyState, pending: set[str]) -> None:
    log.info("%d copy records still in use by another agent or unresolved; retrying",
             len(pending))
    delay = RETRY_FIRST
    while pending:
        await asyncio.sleep(delay)
        done = await _clean(state, pending)
        if done is not None:
            pending = done.pending
        delay = min(delay * 2, RETRY_MAX)


def shutdown(state: CopyState) -> None:
    """Stop the retries and the worker threads (queued work is cancelled; running calls
    finish)."""
    if state.cleanup_task is not None:
        state.cleanup_task.cancel()
    state.workers.shutdown()
    state.hashers.shutdown()
