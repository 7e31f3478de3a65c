"""Start a server process for tests: output to a log file, wait until it is ready."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def start_logged(argv: Sequence[str], log_path: Path, *, ready: Callable[[], bool],
                 log_tail: Callable[[], str], what: str,
                 timeout: float) -> subprocess.Popen[bytes]:
    """Spawn ``argv`` in its own session (so it can be stopped by its process group),
    appending its output to ``log_path``; return once ``ready()`` holds.

    Raises RuntimeError if it exits first, TimeoutError (after killing it) if it is
    not ready in time.
    """
    with log_path.open("ab") as log:
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log_tail()}")
        if ready():
            return proc
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise TimeoutError(f"{what} not ready: {log_tail()}")
