"""Shared pod and event informers: one pair per namespace in use, or one pair
cluster-wide (namespace ""), whatever the number of pods followed.

This is the shape of client-go's SharedInformerFactory: every consumer of a
namespace (the collections' feeds, every per-pod progress stream) shares its two
watches (``Sources`` starts a source with its first user and stops it a linger after
its last). Events are indexed by pod, only kubelet's pull reasons, at most
``EVENTS_PER_POD`` per pod.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aggapi.apiserver.podslim import slim_pod
from aggapi.apiserver.shared import Shared
from aggapi.kube.client import KubeClient, KubeError, path_segment
from aggapi.kube.informer import Informer

PodKey = tuple[str, str]  # (namespace, name)
# Events kept per pod: kubelet counts repeats in one Event, so a pod's pull history
# fits in a few; the oldest go first (memory per followed pod stays bounded).
EVENTS_PER_POD = 32
PULL_REASONS = frozenset({"Pulling", "Pulled", "Failed", "BackOff"})


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The event without its managedFields (server-side apply's bookkeeping): nothing
    here reads them. (Pods keep only the fields read: ``podslim``.)"""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _pull_event(ev: dict[str, Any]) -> dict[str, Any] | None:
    """Only kubelet's pull events are kept (Scheduled, Created, Started... are not
    read here)."""
    return _slim(ev) if ev.get("reason") in PULL_REASONS else None


def pod_key(obj: Mapping[str, Any]) -> PodKey:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _event_pod(ev: Mapping[str, Any]) -> PodKey:
    inv = ev.get("involvedObject") or {}
    ns = inv.get("namespace") or (ev.get("metadata") or {}).get("namespace") or ""
    return str(ns), str(inv.get("name") or "")


class Source:
    """The pods of one scope and kubelet's pull events about them, indexed by pod."""

    def __init__(self, api: KubeClient, namespace: str) -> None:
        self.namespace = namespace
        self._api = api
        base = f"/api/v1/namespaces/{path_segment(namespace)}" if namespace else "/api/v1"
        self.pods = Informer(api, f"{base}/pods", transform=slim_pod)
        self._events = Informer(api, f"{base}/events",
                                {"fieldSelector": "involvedObject.kind=Pod"},
                                transform=_pull_event)
        self._by_pod: dict[PodKey, dict[str, Mapping[str, Any]]] = {}
        # (what changed: a pod key, or None for "everything", after a relist)
        self.listeners: list[Callable[[PodKey | None], None]] = []
        # Listeners of one pod each (a per-pod stream): a change costs its pod's only.
        self.pod_listeners: dict[PodKey, list[Callable[[], None]]] = {}
        self.pods.add_listener(self._pod_changed)
        self._events.add_listener(self._event_changed)

    def _notify(self, key: PodKey | None) -> None:
        for fn in self.listeners:
            fn(key)
        if key is None:
            for fns in list(self.pod_listeners.values()):
                for one in list(fns):
                    one()
        else:
            for one in list(self.pod_listeners.get(key, ())):
                one()

    def listen_pod(self, key: PodKey, fn: Callable[[], None]) -> Callable[[], None]:
        """Call ``fn`` after every change of pod ``key`` or its events; the undo."""
        self.pod_listeners.setdefault(key, []).append(fn)

        def undo() -> None:
            fns = self.pod_listeners.get(key, [])
            with contextlib.suppress(ValueError):
                fns.remove(fn)
            if not fns:
                self.pod_listeners.pop(key, None)
        return undo

    def pod(self, key: PodKey) -> dict[str, Any] | None:
        return self.pods.items.get(f"{key[0]}/{key[1]}")

    async def exists(self, key: PodKey) -> bool:
        """Whether kube-apiserver has pod ``key`` now (one read): a warm informer may
        not have seen a pod made a moment ago."""
        try:
            await self._api.get(f"/api/v1/namespaces/{path_segment(key[0])}/pods/"
                                f"{path_segment(key[1])}")
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _pod_changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self._by_pod.pop(pod_key(obj), None)
        self._notify(None if kind == "RELIST" else pod_key(obj))

    def _event_changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "RELIST":
            self._by_pod = {}
            for ev in self._events.items.values():
                self._index(ev)
            self._notify(None)
            return
        key = _event_pod(obj)
        name = str((obj.get("metadata") or {}).get("name") or "")
        if kind == "DELETED":
            self._by_pod.get(key, {}).pop(name, None)
        else:
            self._index(obj)
        self._notify(key)

    def _index(self, ev: Mapping[str, Any]) -> None:
        # Only pull events reach here: the informer keeps no others (_pull_event).
        evs = self._by_pod.setdefault(_event_pod(ev), {})
        name = str((ev.get("metadata") or {}).get("name") or "")
        evs.pop(name, None)  # re-inserted last: the newest go last, the oldest first out
        evs[name] = ev
        while len(evs) > EVENTS_PER_POD:
            del evs[next(iter(evs))]

    def events_of(self, key: PodKey) -> list[Mapping[str, Any]]:
        return list(self._by_pod.get(key, {}).values())

    @property
    def synced(self) -> bool:
        return self.pods.synced.is_set() and self._events.synced.is_set()

    async def wait_synced(self, timeout: float | None) -> None:
        await asyncio.wait_for(asyncio.gather(self.pods.synced.wait(),
                                              self._events.synced.wait()), timeout)

    def start(self) -> None:
        self.pods.start()
        self._events.start()

    async def stop(self) -> None:
        await asyncio.gather(self.pods.stop(), self._events.stop())

    # The watches this source holds on kube-apiserver.
    WATCHES = 2


class Sources:
    """The shared Sources: started by their first user, stopped ``linger`` seconds
    after their last."""

    def __init__(self, api: KubeClient, *, linger: float) -> None:
        self._shared: Shared[str, Source] = Shared(lambda ns: Source(api, ns), linger=linger)

    def acquire(self, namespace: str) -> Source:
        return self._shared.acquire(namespace)

    def release(self, namespace: str) -> None:
        self._shared.release(namespace)

    @contextlib.asynccontextmanager
    async def of(self, namespace: str) -> AsyncIterator[Source]:
        """A source holding ``namespace``'s pods: the cluster-wide one while it runs
        and is synced, else the namespace's own."""
        async with self._shared.use_covering(namespace, "", lambda s: s.synced) as source:
            yield source

    def watches(self) -> int:
        """Watches held on kube-apiserver for pods and events now."""
        return Source.WATCHES * len(self._shared.parts())

    async def close(self) -> None:
        await self._shared.close()
