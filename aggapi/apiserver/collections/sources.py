"""Shared pod and event informers: one pair per namespace in use, or one pair
cluster-wide (namespace ""), whatever the number of pods followed.

This is the shape of client-go's SharedInformerFactory: every consumer of a
namespace shares its two watches (``shared.Shared`` starts a source with its first
user and stops it a linger after its last). Events are indexed by pod, only
kubelet's pull reasons, at most ``EVENTS_PER_POD`` per pod.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from aggapi.kube.client import KubeClient, path_segment
from aggapi.kube.informer import Informer

PodKey = tuple[str, str]  # (namespace, name)
# Events kept per pod: kubelet counts repeats in one Event, so a pod's pull history
# fits in a few; the oldest go first (memory per followed pod stays bounded).
EVENTS_PER_POD = 32
PULL_REASONS = frozenset({"Pulling", "Pulled", "Failed", "BackOff"})


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without its managedFields (server-side apply's bookkeeping, often
    the bulk of a pod's metadata): nothing here reads them, and a cluster's worth of
    pods is held."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def _pull_event(ev: dict[str, Any]) -> dict[str, Any] | None:
    """Only kubelet's pull events are kept (Scheduled, Created, Started... are not
    read here)."""
    return _slim(ev) if ev.get("reason") in PULL_REASONS else None


def _pod_key(obj: Mapping[str, Any]) -> PodKey:
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
        base = f"/api/v1/namespaces/{path_segment(namespace)}" if namespace else "/api/v1"
        self.pods = Informer(api, f"{base}/pods", transform=_slim)
        self._events = Informer(api, f"{base}/events",
                                {"fieldSelector": "involvedObject.kind=Pod"},
                                transform=_pull_event)
        self._by_pod: dict[PodKey, dict[str, Mapping[str, Any]]] = {}
        # (what changed: a pod key, or None for "everything", after a relist)
        self.listeners: list[Callable[[PodKey | None], None]] = []
        self.pods.add_listener(self._pod_changed)
        self._events.add_listener(self._event_changed)

    def _notify(self, key: PodKey | None) -> None:
        for fn in self.listeners:
            fn(key)

    def _pod_changed(self, kind: str, obj: Mapping[str, Any]) -> None:
        if kind == "DELETED":
            self._by_pod.pop(_pod_key(obj), None)
        self._notify(None if kind == "RELIST" else _pod_key(obj))

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
