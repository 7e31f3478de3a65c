"""A bounded thread pool for the copy engine's blocking file-system calls.

Its own pool (not the loop's default executor) so many copies cannot starve
other agent work, and so memory stays bounded: each copy has at most a couple
of chunks in flight.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Workers:
    def __init__(self, max_workers: int = 8) -> None:
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="aggapi-copy")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> asyncio.Future[T]:
        """Start ``fn`` now; await the future later (to overlap I/O with the network)."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self.pool, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
