"""The part of a PodImagePull build that only kube's objects decide (the pod's
containers and kubelet's view of each), remembered per version of the pod and its
events.

In a rollout a pulling pod's object is rebuilt each time its node's bytes move (every
poll, for thousands of pods at once) while the pod and its events stay as they were:
reading its spec and ordering its events again was a third of each build (issue 36).

The key is what kube-apiserver says names one content: the pod's uid and
resourceVersion and each event's namespace, name and resourceVersion, in the order
given (ties in time keep that order). An object without them (a fake's) is never
remembered. Bounded: at most ``ENTRIES`` parts (least recently used first out), and
only parts of a bounded size (containers, events, image bytes), as a pod and its
events come from any namespace editor.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggapi import imageref
from aggapi.apiserver.imagepullprogress.merge import pulls_always
from aggapi.apiserver.imagepullprogress.pullstate import K8sView, Who, kubelet_events, views
from aggapi.apiserver.pods import containers_of
from aggapi.auth.capability import ContainerRef

# Above the pods a rollout rebuilds by turns (each node poll, every pod pulling there:
# about 5,400 at 50,000 pods on 5,000 nodes), as a cycle longer than the bound would
# never hit; about 0.75 KiB each (one container, two events): 6 MiB when full.
ENTRIES = 8192
MAX_CONTAINERS, MAX_EVENTS, MAX_IMAGE_CHARS = 8, 8, 1024


@dataclass(frozen=True, slots=True)
class KubePart:
    node: str  # "" while unscheduled
    containers: tuple[ContainerRef, ...]
    k8s: Mapping[Who, K8sView]  # (never changed once built: shared by builds)
    always: frozenset[Who]
    names: tuple[tuple[str, str] | None, ...]  # each container's imageref.identity


_parts: OrderedDict[tuple[Any, ...], KubePart] = OrderedDict()


def build(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> KubePart:
    """The part, computed (as ``Merger.update`` does from ``kubelet_events``)."""
    spec = pod.get("spec") or {}
    containers = containers_of(spec)
    return KubePart(node=spec.get("nodeName") or "", containers=containers,
                    k8s=views(pod, kubelet_events(pod, events), containers),
                    always=frozenset(pulls_always(spec)),
                    names=tuple(imageref.identity(c.image) for c in containers))


def _key(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]
         ) -> tuple[Any, ...] | None:
    if len(events) > MAX_EVENTS:
        return None
    meta = pod.get("metadata") or {}
    uid, rv = meta.get("uid"), meta.get("resourceVersion")
    if type(uid) is not str or type(rv) is not str or not uid or not rv:
        return None
    evs = []
    for e in events:
        m = e.get("metadata") or {}
        ns, name, erv = m.get("namespace"), m.get("name"), m.get("resourceVersion")
        if type(ns) is not str or type(name) is not str or type(erv) is not str or not erv:
            return None
        evs.append((ns, name, erv))
    return (uid, rv, *evs)


def _small(part: KubePart) -> bool:
    return len(part.containers) <= MAX_CONTAINERS and sum(
        len(c.image) + len(c.name) for c in part.containers) <= MAX_IMAGE_CHARS


def kube_part(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> KubePart:
    """:func:`build`'s answer, remembered for this version of the pod and events."""
    key = _key(pod, events)
    if key is None:
        return build(pod, events)
    part = _parts.get(key)
    if part is not None:
        _parts.move_to_end(key)
        return part
    part = build(pod, events)
    if _small(part):
        _parts[key] = part
        if len(_parts) > ENTRIES:
            _parts.popitem(last=False)
    return part


def forget() -> None:
    """Every remembered part (tests)."""
    _parts.clear()
