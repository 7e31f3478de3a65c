"""A small list+watch cache (an "informer") over aggapi.kube.client, holding plain dicts.

Used where aggapi needs current cluster state on every request without one API
call per request: the agent EndpointSlices (node -> agent address), the collections'
pods and events. It lists in pages, relists on 410 Gone and reconnects with backoff,
the way client-go's reflector does; a transform decides what of each object is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from aggapi import tasks
from aggapi.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)

Listener = Callable[[str, Mapping[str, Any]], None]
# What the cache keeps of an object (None: not kept), as client-go's SetTransform:
# a cluster's worth of pods is held for as long as the informer runs.
Transform = Callable[[dict[str, Any]], dict[str, Any] | None]
LIST_PAGE = 500  # objects per list page, as client-go's reflector


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace") or ""
    return f"{ns}/{meta.get('name', '')}"


class Informer:
    """Keep ``items`` equal to what listing ``path`` with ``params`` (selectors) returns,
    via watch. ``path`` is a collection, e.g. ``/api/v1/namespaces/ns/pods``."""

    def __init__(
        self,
        kube: KubeClient,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        watch_timeout: int = 300,
        max_backoff: float = 30.0,
        transform: Transform | None = None,
    ) -> None:
        self._kube = kube
        self.path = path
        self._params = dict(params or {})
        self._watch_timeout = watch_timeout
        self._max_backoff = max_backoff
        self._transform = transform
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self._listeners: list[Listener] = []
        self._task: asyncio.Task[None] | None = None

    def add_listener(self, fn: Listener) -> None:
        """``fn(event_type, obj)`` after every change (ADDED/MODIFIED/DELETED/RELIST)."""
        self._listeners.append(fn)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"informer:{self.path}")

    async def stop(self) -> None:
        await tasks.cancel(self._task)
        self._task = None

    def _notify(self, kind: str, obj: Mapping[str, Any]) -> None:
        for fn in self._listeners:
            try:
                fn(kind, obj)
            except Exception:  # a listener bug must not kill the cache
                log.exception("informer listener failed")

    def _keep(self, obj: dict[str, Any]) -> dict[str, Any] | None:
        return obj if self._transform is None else self._transform(obj)

    async def _relist(self) -> str:
        # In pages: a cluster's pods in one response would be parsed all at once.
        items: dict[str, dict[str, Any]] = {}
        cont, pages, began = "", 0, time.monotonic()
        while True:
            pages += 1
            params = {**self._params, "limit": str(LIST_PAGE)}
            if cont:
                params["continue"] = cont
            data = await self._kube.get(self.path, params)
            for o in data.get("items") or []:
                if (kept := self._keep(o)) is not None:
                    items[_key(kept)] = kept
            meta = data.get("metadata") or {}
            cont = str(meta.get("continue") or "")
            if not cont:
                break
        self.items = items
        log.info("informer listed", extra={"path": self.path, "objects": len(items),
                                           "pages": pages,
                                           "seconds": round(time.monotonic() - began, 2)})
        self.synced.set()
        self._notify("RELIST", {})
        return str(meta.get("resourceVersion") or "")

    async def _run(self) -> None:
        backoff = 0.5
        while True:
            try:
                rv = await self._relist()
                backoff = 0.5
                while True:
                    rv = await self._watch(rv)
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.status != 410:  # 410 Gone: our resourceVersion expired; relist
                    log.warning("informer %s: %s", self.path, exc)
            except Exception as exc:  # keep the cache alive through outages
                log.warning("informer %s: %r", self.path, exc)
            await asyncio.sleep(backoff * (1 + random.random() / 2))
            backoff = min(backoff * 2, self._max_backoff)

    async def _watch(self, rv: str) -> str:
        events = self._kube.watch(self.path, self._params, resource_version=rv,
                                  timeout_seconds=self._watch_timeout)
        async with contextlib.aclosing(events):
            async for kind, obj in events:
                if kind == "ERROR":
                    raise KubeError.from_status(500, obj)
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if kind == "BOOKMARK":
                    continue
                kept = self._keep(obj)
                if kept is None:
                    # Not kept (any more): gone from the cache, as a deletion.
                    if self.items.pop(_key(obj), None) is not None:
                        self._notify("DELETED", obj)
                    continue
                if kind == "DELETED":
                    self.items.pop(_key(kept), None)
                else:
                    self.items[_key(kept)] = kept
                self._notify(kind, kept)
        return rv
