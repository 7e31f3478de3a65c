"""Shared, ref-counted watches of one pod and its events.

A thousand clients following the same pod cost one pod watch and one event watch,
not a thousand: the first subscriber starts them, the last one stops them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aggapi.apiserver.imagepullprogress.pullstate import kubelet_events
from aggapi.kube.client import KubeClient, path_segment
from aggapi.kube.informer import Informer


class PodWatch:
    """The latest pod object and its events; ``changed`` wakes waiters on any update."""

    def __init__(self, api: KubeClient, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        self.version = 0
        self._cond = asyncio.Condition()
        ns = f"/api/v1/namespaces/{path_segment(namespace)}"
        self._pod = Informer(api, f"{ns}/pods", {"fieldSelector": f"metadata.name={name}"})
        self._events = Informer(api, f"{ns}/events", {
            "fieldSelector": f"involvedObject.name={name},involvedObject.kind=Pod"})
        for inf in (self._pod, self._events):
            inf.add_listener(lambda _k, _o: self._bump())
        self.refs = 0

    def _bump(self) -> None:
        self.version += 1

        async def notify() -> None:
            async with self._cond:
                self._cond.notify_all()

        asyncio.get_running_loop().create_task(notify())

    def start(self) -> None:
        self._pod.start()
        self._events.start()

    async def stop(self) -> None:
        await asyncio.gather(self._pod.stop(), self._events.stop())

    async def synced(self, timeout: float = 10.0) -> None:
        await asyncio.wait_for(
            asyncio.gather(self._pod.synced.wait(), self._events.synced.wait()), timeout)

    @property
    def pod(self) -> dict[str, Any] | None:
        return self._pod.items.get(f"{self.namespace}/{self.name}")

    @property
    def events(self) -> list[dict[str, Any]]:
        return kubelet_events(self.pod or {}, self._events.items.values())

    async def wait_changed(self, since: int, timeout: float) -> int:
        """Wait until ``version`` moves past ``since`` or ``timeout``; return the version."""
        async with self._cond:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._cond.wait_for(lambda: self.version != since), timeout)
        return self.version


class PodWatchHub:
    def __init__(self, api: KubeClient) -> None:
        self._api = api
        self._watches: dict[tuple[str, str], PodWatch] = {}

    @contextlib.asynccontextmanager
    async def watch(self, namespace: str, name: str) -> AsyncIterator[PodWatch]:
        key = (namespace, name)
        w = self._watches.get(key)
        if w is None:
            w = self._watches[key] = PodWatch(self._api, namespace, name)
            w.start()
        w.refs += 1
        try:
            yield w
        finally:
            w.refs -= 1
            if w.refs == 0 and self._watches.get(key) is w:
                del self._watches[key]
                await w.stop()

    def __len__(self) -> int:
        return len(self._watches)

    async def close(self) -> None:
        watches, self._watches = list(self._watches.values()), {}
        await asyncio.gather(*(w.stop() for w in watches))
