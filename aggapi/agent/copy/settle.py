"""Worker calls that survive the cancellation of the request awaiting them.

When a client goes away its handler task is cancelled, but a worker thread already
running a call goes on: it may still read from an fd the handler would close, or
be about to return an fd or a temp file nobody would then release. :func:`call`
waits the call out (bounded: one file-system call, or one chunk of a cancellable
hash) and hands what it made to ``undo``; :func:`settle` finishes a clean-up step
even when cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aggapi.agent.copy.workers import Workers

log = logging.getLogger(__name__)

T = TypeVar("T")


async def wait_out(fut: asyncio.Future[Any]) -> None:
    """Wait until ``fut`` is done, whatever cancellations arrive meanwhile."""
    while not fut.done():
        try:
            await asyncio.wait([fut])
        except asyncio.CancelledError:
            continue


async def settle(aw: Awaitable[Any]) -> None:
    """Finish clean-up even if the request task is being cancelled."""
    fut = asyncio.ensure_future(aw)
    try:
        await asyncio.shield(fut)
    except asyncio.CancelledError:
        await wait_out(fut)
        raise


async def call(workers: Workers, fn: Callable[..., T], *args: Any,
               undo: Callable[[T], object] | None = None) -> T:
    """``fn(*args)`` in a worker. If the caller is cancelled meanwhile, wait for the
    call to end and, if it returned, run ``undo`` on its result (also in a worker)."""
    fut = workers.submit(fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await wait_out(fut)
        if undo is not None and not fut.cancelled() and fut.exception() is None:
            done = workers.submit(undo, fut.result())
            await wait_out(done)
            if not done.cancelled() and done.exception() is not None:
                log.warning("clean-up after a cancelled copy failed: %s", done.exception())
        raise
