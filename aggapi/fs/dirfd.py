"""Walking down a directory tree by file descriptor, one component at a time.

Both sides that write untrusted trees (the agent into a container, the client into
the user's directory) open each component relative to the previous one, so no path
is ever resolved as a whole; this holds the fd bookkeeping they share.
"""

from __future__ import annotations

import os
from collections.abc import Callable


def descend(start_fd: int, steps: int, open_step: Callable[[int, int], int]) -> int:
    """The fd reached after ``steps`` calls of ``open_step(fd, i)``, each given the fd
    of the previous step (``start_fd`` first, which stays open). Only the returned fd
    is left open, also when a step raises."""
    fd = os.dup(start_fd)
    try:
        for i in range(steps):
            nfd = open_step(fd, i)
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise
