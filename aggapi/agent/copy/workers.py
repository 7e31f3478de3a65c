"""A bounded, fairly shared thread pool for the copy engine's blocking file-system calls.

Its own pool (not the loop's default executor) so many copies cannot starve
other agent work, and so memory stays bounded: each copy has at most a couple
of chunks in flight. Every call runs with the credentials of the copy that
submitted it (:data:`aggapi.agent.copy.creds.CURRENT`, read when the call is
submitted), switched on the worker thread and switched back afterwards.

Fair share: calls wait in one queue per request (the asyncio task that submitted
them) within one queue per namespace (:data:`TENANT`, set while a copy holds its
slot), and a free thread takes the next call round-robin, namespace by namespace,
then request by request. A namespace runs at most its ``share`` of the threads at
once, so one tenant's tar flood or hashes leave threads free for the others, and a
small copy waits for at most one call of each request ahead of it, not for a big
copy's whole backlog. The queues are kept on the event loop; the threads only run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

from aggapi.agent.copy import creds

P = ParamSpec("P")
T = TypeVar("T")

# The namespace whose copy is submitting (aggapi.agent.copy.quotas.CopySlots.slot).
TENANT: ContextVar[str | None] = ContextVar("aggapi_copy_tenant", default=None)

_Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]


def _call_as(c: creds.Creds | None, fn: Callable[[], T]) -> T:
    with creds.acting_as(c):
        return fn()


def _back_on(loop: asyncio.AbstractEventLoop, finished: Callable[..., None], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(finished, *args)
    except RuntimeError:  # the loop is closed: nobody waits for this call any more
        pass


class Workers:
    def __init__(self, max_workers: int = 8, *, share: float = 1.0,
                 initializer: Callable[[], None] | None = None) -> None:
        # initializer: run once on each thread as it starts (the hash pool lowers its
        # threads' priority).
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="aggapi-copy",
                                       initializer=initializer)
        self.max_workers = max_workers
        # Threads one namespace may occupy at once (at least one).
        self.tenant_cap = max(1, min(max_workers, int(max_workers * share)))
        self.running = 0
        self.running_by: dict[str | None, int] = {}
        # namespace -> request -> calls; dict order is the round-robin order.
        self.queues: dict[str | None, dict[Hashable, deque[_Job]]] = {}
        self._closed = False

    def _job(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
        return functools.partial(_call_as, creds.CURRENT.get(),
                                 functools.partial(fn, *args, **kwargs))

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        return await self.submit(fn, *args, **kwargs)

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Queue ``fn`` now; await the future later (to overlap I/O with the network).
        Cancelling the future drops a call not started yet; a started one finishes."""
        if self._closed:
            raise RuntimeError("copy workers are shut down")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        tenant = TENANT.get()
        request: Hashable = asyncio.current_task() or fut
        self.queues.setdefault(tenant, {}).setdefault(request, deque()).append(
            (self._job(fn, *args, **kwargs), fut))
        self._dispatch()
        return fut

    def _next(self) -> tuple[str | None, _Job] | None:
        """The next call round-robin among namespaces under their cap, or None."""
        for tenant in list(self.queues):
            if self.running_by.get(tenant, 0) >= self.tenant_cap:
                continue
            requests = self.queues.pop(tenant)  # re-added last: its turn is used
            request, calls = next(iter(requests.items()))
            del requests[request]
            job = calls.popleft()
            if calls:
                requests[request] = calls  # last among this namespace's requests
            if requests:
                self.queues[tenant] = requests
            return tenant, job
        return None

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self.running < self.max_workers:
            picked = self._next()
            if picked is None:
                return
            tenant, (call, fut) = picked
            if fut.done():  # cancelled while queued
                continue
            self.running += 1
            self.running_by[tenant] = self.running_by.get(tenant, 0) + 1
            done = self.pool.submit(call)
            # Back on the loop when the thread is done (the queues are the loop's alone).
            done.add_done_callback(functools.partial(_back_on, loop, self._finished,
                                                     tenant, fut))

    def _finished(self, tenant: str | None, fut: asyncio.Future[Any],
                  done: concurrent.futures.Future[Any]) -> None:
        self.running -= 1
        left = self.running_by[tenant] - 1
        if left:
            self.running_by[tenant] = left
        else:
            del self.running_by[tenant]
        exc = None if done.cancelled() else done.exception()  # retrieved even if unused
        if not fut.done():
            if done.cancelled():
                fut.cancel()
            elif exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(done.result())
        if not self._closed:
            self._dispatch()

    def queued(self) -> int:
        return sum(len(c) for r in self.queues.values() for c in r.values())

    def shutdown(self) -> None:
        """Cancel queued calls and stop the threads (running calls finish)."""
        self._closed = True
        for requests in self.queues.values():
            for calls in requests.values():
                for _, fut in calls:
                    fut.cancel()
        self.queues.clear()
        self.pool.shutdown(wait=False, cancel_futures=True)
