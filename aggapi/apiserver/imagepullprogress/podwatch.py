"""One pod and its kubelet events, for a progress stream, read from the shared
informers (``podsources``): the namespace's pair of watches, or the
cluster-wide pair while it runs.

A thousand streams of pods in one namespace cost two watches on kube-apiserver, not
two per pod; a change wakes only its own pod's streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from aggapi.apiserver.imagepullprogress.pullstate import kubelet_events
from aggapi.apiserver.podsources import Source, Sources


class PodWatch:
    """The latest pod object and its events; ``version`` moves on any change."""

    def __init__(self, source: Source, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        self._source = source
        self._key = (namespace, name)
        self.version = 0
        self._changed = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def synced(self, timeout: float = 10.0) -> None:
        """The source has listed (TimeoutError after ``timeout``); and if it lacks the
        pod but kube-apiserver has it (made a moment ago, its ADDED still on the way),
        until it arrives."""
        async with asyncio.timeout(timeout):
            await self._source.wait_synced(None)
            if self.pod is not None or not await self._source.exists(self._key):
                return
            while self.pod is None:
                await self.wait_changed(self.version, timeout)

    @property
    def pod(self) -> dict[str, Any] | None:
        return self._source.pod(self._key)

    @property
    def events(self) -> list[Mapping[str, Any]]:
        return kubelet_events(self.pod or {}, self._source.events_of(self._key))

    async def wait_changed(self, since: int, timeout: float) -> int:
        """Wait until ``version`` moves past ``since`` or ``timeout``; return the version."""
        if self.version == since:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return self.version


class PodWatchHub:
    def __init__(self, sources: Sources) -> None:
        self._sources = sources
        self._open = 0

    @contextlib.asynccontextmanager
    async def watch(self, namespace: str, name: str) -> AsyncIterator[PodWatch]:
        async with self._sources.of(namespace) as source:
            w = PodWatch(source, namespace, name)
            undo = source.listen_pod((namespace, name), w.bump)
            self._open += 1
            try:
                yield w
            finally:
                self._open -= 1
                undo()

    def __len__(self) -> int:
        """Pods followed now (their watches are the shared sources')."""
        return self._open
