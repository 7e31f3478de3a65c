"""NodeImagePull: one node's in-flight pulls, its pull slots and the pods waiting
for one, and its table columns. For cluster readers: it names every namespace's
images on the node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aggapi import GROUP_VERSION
from aggapi.apiserver.collections.table import AGE_COLUMN, age
from aggapi.apiserver.imagepullprogress.nodeview import slots_of

KIND, LIST_KIND, RESOURCE = "NodeImagePull", "NodeImagePullList", "nodeimagepulls"


def node_image_pull(node: str, view: Mapping[str, Any] | None, error: str,
                    pods: Iterable[Mapping[str, Any]], created: str = "") -> dict[str, Any]:
    """``pods``: the PodImagePulls on ``node``; those with an image waiting for a slot
    are listed. ``created``: when the node's agent appeared (its pod's
    creationTimestamp), the object's creationTimestamp."""
    pulls = [p for p in (view or {}).get("pulls") or () if isinstance(p, Mapping)]
    slots = slots_of(view or {})
    in_flight = (view or {}).get("inFlight")
    waiting = sorted(
        f"{(p.get('metadata') or {}).get('namespace')}/{(p.get('metadata') or {}).get('name')}"
         for p in pods if any(i.get("waitingForSlot")
                              for i in (p.get("status") or {}).get("images") or ()))
    return {
        "apiVersion": GROUP_VERSION, "kind": KIND,
        "metadata": {"name": node, **({"creationTimestamp": created} if created else {})},
        "status": {
            "pulling": in_flight if isinstance(in_flight, int) else len(pulls),
            "slots": {"used": in_flight if isinstance(in_flight, int) else None,
                      "limit": slots["limit"], "serialize": slots["serialize"]},
            "pulls": [{"images": list(p.get("images") or []),
                       "repositories": list(p.get("repositories") or []),
                       "phase": p.get("phase"), "progress": p.get("progress"),
                       "total": p.get("total"), "bytesPerSecond": p.get("bytesPerSecond"),
                       "startedAt": p.get("startedAt")} for p in pulls],
            "waitingPods": waiting,
            "linkBytesPerSecond": (view or {}).get("linkBytesPerSecond"),
            "error": error or str((view or {}).get("error") or ""),
        },
    }


FIELDS = {"metadata.name": lambda o: str((o.get("metadata") or {}).get("name") or "")}

COLUMNS: list[dict[str, Any]] = [
    {"name": "Name", "type": "string", "format": "name", "priority": 0,
     "description": "Name of the node"},
    {"name": "Pulling", "type": "integer", "format": "", "priority": 0,
     "description": "Image pulls in flight on the node"},
    {"name": "Slots", "type": "string", "format": "", "priority": 0,
     "description": "kubelet's pull slots in use of its limit (maxParallelImagePulls)"},
    {"name": "Waiting Pods", "type": "integer", "format": "", "priority": 0,
     "description": "Pods with an image waiting for a pull slot"},
    AGE_COLUMN,
    {"name": "Pods", "type": "string", "format": "", "priority": 1,
     "description": "The pods waiting for a pull slot"},
]


def cells(obj: Mapping[str, Any]) -> list[Any]:
    status = obj.get("status") or {}
    slots = status.get("slots") or {}
    used, limit = slots.get("used"), slots.get("limit")
    waiting = status.get("waitingPods") or []
    return [(obj.get("metadata") or {}).get("name"), status.get("pulling", 0),
            f"{'?' if used is None else used}/{'-' if limit is None else limit}",
            len(waiting), age(obj), ",".join(waiting) or "<none>"]
