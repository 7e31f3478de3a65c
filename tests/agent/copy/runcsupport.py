"""What the runc-container copy tests share (test_runc_escape_corpus.py,
test_runc_paths.py, test_runc_failures.py): the pod name, busybox, a container's pid,
polling. Their ``agent_dirs`` fixture is in conftest.py."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from aggapi.runtime.cri import CRIClient

POD = "p"  # the pod name Agent.token puts in its capabilities
BB = "/bin/busybox"


async def container_pid(cri: CRIClient, cid: str) -> int:
    st = await cri.container_status(cid, verbose=True)
    assert st is not None and st.pid, st
    return st.pid


async def wait_for(cond: Any, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.02)

