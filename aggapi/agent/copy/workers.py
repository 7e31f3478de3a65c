"""A bounded thread pool for the copy engine's blocking file-system calls.

Its own pool (not the loop's default executor) so many copies cannot starve
other agent work, and so memory stays bounded: each copy has at most a couple
of chunks in flight. Every call runs with the credentials of the copy that
submitted it (:data:`aggapi.agent.copy.creds.CURRENT`, read when the call is
submitted), switched on the worker thread and switched back afterwards.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from aggapi.agent.copy import creds

P = ParamSpec("P")
T = TypeVar("T")


def _call_as(c: creds.Creds | None, fn: Callable[[], T]) -> T:
    with creds.acting_as(c):
        return fn()


class Workers:
    def __init__(self, max_workers: int = 8) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="aggapi-copy")

    def _job(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Callable[[], T]:
        return functools.partial(_call_as, creds.CURRENT.get(),
                                 functools.partial(fn, *args, **kwargs))

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        job = self._job(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.pool, job)

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Start ``fn`` now; await the future later (to overlap I/O with the network)."""
        job = self._job(fn, *args, **kwargs)
        return asyncio.get_running_loop().run_in_executor(self.pool, job)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
