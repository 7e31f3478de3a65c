"""The merge policy: Kubernetes' view (what kubelet decided) applied to the agent's
objects (what the runtime shows), for one stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aggapi import imageref
from aggapi.apiserver.imagepullprogress.objects import now
from aggapi.apiserver.imagepullprogress.pullstate import K8sView, views
from aggapi.capability import ContainerRef

# Agent phases that mean "the runtime shows no activity for this image yet".
IDLE_PHASES = ("Unknown", "Waiting", "Resolving")
K8S_FAILURES = ("Failed", "BackOff")


class Merger:
    """Applies Kubernetes' view to the agent's objects for one stream."""

    def __init__(self, containers: Sequence[ContainerRef]) -> None:
        self.containers = containers
        self.k8s: dict[str, K8sView] = {}
        self.node_view: dict[str, Any] | None = None

    def update(self, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> None:
        self.k8s = views(pod, events, self.containers)

    def failure(self) -> dict[str, Any] | None:
        """The Error object that ends the stream if kubelet gave up on an image."""
        for c in self.containers:
            v = self.k8s.get(c.name)
            if v is not None and v.phase in K8S_FAILURES:
                return {"kind": "Error", "container": c.name, "image": c.image,
                        "phase": v.phase, "error": v.error or f"image pull {v.phase}",
                        "time": now()}
        return None

    def queued(self, obj: Mapping[str, Any]) -> bool:
        """kubelet is pulling this image but the runtime shows nothing yet."""
        v = self.k8s.get(str(obj.get("container") or ""))
        return (v is not None and v.phase == "Pulling" and obj.get("phase") in IDLE_PHASES
                and int(obj.get("progress") or 0) <= 0)

    def waiting(self, image: str) -> dict[str, Any] | None:
        """The node's pull slots are all taken, by pulls other than this image's own."""
        nv = self.node_view
        if not nv:
            return None
        free = nv.get("slotsFree")
        if free is None or free > 0:
            return None
        try:
            ref = imageref.parse(image)
        except imageref.InvalidReference:
            return None
        for pull in nv.get("pulls") or []:
            if str(ref) in (pull.get("images") or []):
                return None  # the busy slot is this image's own pull, just starting
        return {"inFlight": nv.get("pulls") or [], "limit": (nv.get("kubelet") or {}),
                "inFlightCount": nv.get("inFlight")}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("kind") != "Progress":
            return obj
        name = str(obj.get("container") or "")
        v = self.k8s.get(name)
        if v is None:
            return obj
        if v.phase in K8S_FAILURES:
            return {**obj, "phase": v.phase, "error": v.error}
        if self.queued(obj):
            waiting = self.waiting(str(obj.get("image") or ""))
            if waiting is not None:
                return {**obj, "phase": "Waiting", "waiting": waiting}
        return obj
