"""The file descriptors of one copy request, opened and closed in worker threads: also
when the client leaves while one is being opened or used (aggapi.agent.copy.settle)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aggapi.agent.copy import download as dl
from aggapi.agent.copy.fserrors import fs_status
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.settle import call, settle
from aggapi.agent.copy.state import CopyState


@asynccontextmanager
async def lookup(state: CopyState, root: FsRoot, path: str) -> AsyncIterator[dl.Target]:
    """The path, opened without following its last component; closed on exit."""
    try:
        t = await call(state.workers, dl.lookup, root, path, undo=dl.Target.close)
    except OSError as exc:
        raise fs_status(exc, path) from exc
    try:
        yield t
    finally:
        await settle(state.workers.run(dl.Target.close, t))


def close_fd(fd: int) -> None:
    os.close(fd)


@asynccontextmanager
async def opened(state: CopyState, t: dl.Target,
                  opener: Callable[[dl.Target], int]) -> AsyncIterator[int]:
    """The fd ``opener`` makes for ``t`` (in a worker); closed in a worker on exit, also
    when the client leaves while it is being opened or used."""
    try:
        fd = await call(state.workers, opener, t, undo=close_fd)
    except OSError as exc:
        raise fs_status(exc, t.path) from exc
    try:
        yield fd
    finally:
        await settle(state.workers.run(close_fd, fd))
