"""A pods/copy upload that stalls mid-body, through front proxy -> apiserver -> real agent:
the agent's --body-idle-timeout answers 408, which reaches the client as a Status, and
the agent's copy slot and temp file are gone (issue 13, finding 7)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import tarfile

from aggapi.agent import appkeys
from aggapi.agent.copy.state import CopyState
from tests.agent.copy.conftest import HeldBody
from tests.framework.pods import RunningPod

from .conftest import Stack
from .test_copy import box  # noqa: F401  (fixture)

MARGIN = 60.0


async def test_stalled_upload_is_a_relayed_408_and_frees_the_agent(
        stack: Stack, box: RunningPod) -> None:  # noqa: F811
    state: CopyState = stack.agent.app[appkeys.COPY_STATE]
    state.limits = dataclasses.replace(state.limits, body_idle_timeout=1.0)
    path = stack.pod_path("box", "copy")
    s = stack.session()
    body = HeldBody(first=2)
    try:
        async with asyncio.timeout(MARGIN):
            async with s.post(path, params={"container": "app", "path": "/tmp/stalled"},
                              data=body.chunks()) as resp:
                assert resp.status == 408, await resp.text()
                status = await resp.json()
    finally:
        body.release.set()
    assert status["kind"] == "Status" and status["code"] == 408
    assert state.slots.total == 0
    async with s.post(path, params={"container": "app", "path": "/tmp/after"},
                      data=b"fine") as resp:
        assert resp.status == 200, await resp.text()
    async with s.get(path, params={"container": "app", "path": "/tmp"}) as resp:
        assert resp.status == 200
        with tarfile.open(fileobj=io.BytesIO(await resp.read())) as tf:
            names = [m.name for m in tf.getmembers()]
    assert "after" in names and "stalled" not in names
    assert not [n for n in names if "aggapi-tmp" in n], names
