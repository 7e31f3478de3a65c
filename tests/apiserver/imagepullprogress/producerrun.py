"""A Producer run over the fake kube-apiserver's PodWatch and a scripted agent, for the
test_producer*.py modules."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aggapi.apiserver.imagepullprogress.podwatch import PodWatch
from aggapi.apiserver.imagepullprogress.producer import Producer
from aggapi.apiserver.pods import target_from_pod
from tests.framework.fakekube import FakeKube

from .scripted import Collected, ScriptedAgent, new_broadcast, read_all, watch_of

IMG = "reg/app:1"


@contextlib.asynccontextmanager
async def running(kube: FakeKube, pod: dict[str, Any], agent: ScriptedAgent, *,
                  follow: bool, granularity: str = "image",
                  **kw: Any) -> AsyncIterator[tuple[Collected, asyncio.Task[None]]]:
    async with contextlib.asynccontextmanager(watch_of)(kube, pod) as pw:
        assert isinstance(pw, PodWatch)
        target = target_from_pod(pw.pod or pod)
        bc = new_broadcast()
        prod = Producer(bc, agent, pw, target, target.containers, granularity,  # type: ignore[arg-type]
                        follow, "alice", **kw)
        got = Collected([])
        task = asyncio.create_task(prod.run())
        reader = asyncio.create_task(read_all(bc, got.objs))
        try:
            yield got, task
            await asyncio.wait({task}, timeout=10)
            assert task.done()
            if not task.cancelled():
                task.result()
            bc.finish()
            await asyncio.wait_for(reader, 5)
        finally:
            for t in (task, reader):
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t
