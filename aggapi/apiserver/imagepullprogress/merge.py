"""The merge policy: Kubernetes' view (what kubelet decided) applied to the agent's
objects (what the runtime shows), for one stream.

The phases a client sees follow a pull as kubelet lives it: ``Pending`` (kubelet has
not asked for the image yet, e.g. behind an init container), ``Pulling`` (kubelet
asked, the runtime shows nothing yet), ``Waiting`` (that, and the node is at its pull
limit), then the runtime's ``Resolving``/``Downloading``/``Extracting``/``Done``; a
failure is ``Failed`` then ``BackOff`` until kubelet's next ``Pulling``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aggapi import imageref
from aggapi.apiserver.imagepullprogress.nodeview import slots_of
from aggapi.apiserver.imagepullprogress.objects import now, unknown_to_null
from aggapi.apiserver.imagepullprogress.pullstate import (
    CONTAINER,
    NO_VIEW,
    POD,
    PULLED,
    PULLING,
    K8sView,
    Who,
    views,
    who,
)
from aggapi.auth.capability import ContainerRef

# Agent phases that mean "the runtime shows no activity for this image yet".
IDLE_PHASES = ("Unknown", "Waiting", "Resolving")
K8S_FAILURES = ("Failed", "BackOff")
PENDING, WAITING = "Pending", "Waiting"


def present_phase(v: K8sView) -> str | None:
    """Done or AlreadyPresent for an image kubelet has, as kubelet's Pulled event
    tells it: Done when this pod's own pull brought the image, AlreadyPresent when
    kubelet found it there; None when kubelet has not said (no Pulled event). The
    one decision the stream and the collections share: the agent cannot tell once
    it stopped watching (a follow=false snapshot finds every image already there)."""
    if v.phase != PULLED:
        return None
    if v.pulled_here:
        return "Done"
    return "AlreadyPresent" if v.already_present else None


def pulls_always(spec: Mapping[str, Any]) -> set[Who]:
    """The containers and image volumes of imagePullPolicy Always."""
    always: set[Who] = {(CONTAINER, str(c.get("name"))) for key in (
        "initContainers", "containers", "ephemeralContainers")
        for c in spec.get(key) or () if c.get("imagePullPolicy") == "Always"}
    return always | {("volume", str(v.get("name"))) for v in spec.get("volumes") or ()
                     if (v.get("image") or {}).get("pullPolicy") == "Always"}


def _ref(image: str) -> imageref.ImageRef | None:
    try:
        return imageref.parse(image)
    except imageref.InvalidReference:
        return None


class Merger:
    """Applies Kubernetes' view to the agent's objects for one stream.

    ``see_node_pulls``: the caller may ``get nodes/imagepulls``; otherwise the node's
    pulls for other pods' images are shown as a count only (they name other
    namespaces' images and repositories)."""

    def __init__(self, containers: Sequence[ContainerRef], *,
                 see_node_pulls: bool = False) -> None:
        self.containers = containers
        self.see_node_pulls = see_node_pulls
        self.k8s: dict[Who, K8sView] = {}
        self.node_view: dict[str, Any] | None = None
        # whose pull -> kubelet's attempt when the agent first said Failed: a later
        # attempt makes that Failed stale (the agent keeps it until a new lease shows).
        self._agent_failed_at: dict[Who, int] = {}
        self._always: set[Who] = set()  # imagePullPolicy Always

    # (read only when the node view has pulls to tell apart: not built before)
    @functools.cached_property
    def _own_images(self) -> set[str]:
        return {str(r) for c in self.containers if (r := _ref(c.image)) is not None}

    @functools.cached_property
    def _own_repos(self) -> set[str]:
        return {f"{r.host}/{r.path}" for c in self.containers
                if (r := _ref(c.image)) is not None}

    def update(self, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> None:
        self.k8s = views(pod, events, self.containers)
        self._always = pulls_always(pod.get("spec") or {})

    def restore(self, k8s: Mapping[Who, K8sView], always: Iterable[Who]) -> None:
        """What :meth:`update` computes, computed before for the same pod and events."""
        self.k8s = dict(k8s)
        self._always = set(always)

    def who_of(self, obj: Mapping[str, Any]) -> Who:
        """Whose pull an object of the agent is about: by its container name and image
        (an image volume may be named like a container), a container first when both
        name one image; POD for a pod granularity object."""
        name, image = str(obj.get("container") or ""), str(obj.get("image") or "")
        if not name:
            return POD
        named = [c for c in self.containers if c.name == name]
        best = [c for c in named if c.image == image] or named
        best.sort(key=lambda c: c.kind == "imagevolume")
        return who(best[0]) if best else (CONTAINER, name)

    def _whos(self, w: Who) -> list[Who]:
        return [who(c) for c in self.containers] if w == POD else [w]

    def _pull_ahead(self, w: Who) -> bool:
        """kubelet pulls (or, under imagePullPolicy Always, will pull) this image even
        though it is present: the present record is not the end of it."""
        return any(self.k8s.get(n, NO_VIEW).phase == PULLING
                   or (self.k8s.get(n, NO_VIEW).phase == "" and n in self._always)
                   for n in self._whos(w))

    def pull_ahead(self, obj: Mapping[str, Any]) -> bool:
        """kubelet pulls, or is about to pull, the image of the agent's ``obj``."""
        return self._pull_ahead(self.who_of(obj))

    def hold_summary(self, summary: Mapping[str, Any]) -> bool:
        """The agent's Summary (every image present) is not the end yet: an image it
        found already present is being pulled again by kubelet (imagePullPolicy
        Always, a tag that moved), or is about to be. An image it saw arrive (Done)
        is the end of that pull."""
        images = [i for i in summary.get("images") or () if isinstance(i, Mapping)]
        return any(i.get("phase") == "AlreadyPresent" and self._pull_ahead(self.who_of(i))
                   for i in images)

    def view_of(self, w: Who) -> K8sView:
        """kubelet's view for one container or image volume, or (POD) for the pod:
        the first failure, else the latest pull in progress."""
        if w != POD:
            return self.k8s.get(w, NO_VIEW)
        vs = [self.k8s.get(who(c), NO_VIEW) for c in self.containers]
        for v in vs:
            if v.failed:
                return v
        pulling = [v for v in vs if v.phase == PULLING]
        if pulling:
            return max(pulling, key=lambda v: v.attempt)
        if vs and all(v.phase == PULLED for v in vs):
            return vs[0]
        return NO_VIEW

    def failure(self, follow: bool) -> dict[str, Any] | None:
        """The Error object that ends the stream: when following, only a failure
        kubelet will not retry; for a snapshot, any failure."""
        for c in self.containers:
            v = self.k8s.get(who(c))
            if v is not None and v.failed and (v.permanent or not follow):
                return {"kind": "Error", "container": c.name, "image": c.image,
                        "phase": v.phase, "error": v.error or f"image pull {v.phase}",
                        "attempt": v.attempt, "time": now()}
        return None

    def retrying(self) -> bool:
        """Worth asking the agent again after it said a pull failed: kubelet is pulling
        again (a new attempt is under way), or says every image the agent saw fail
        arrived after all."""
        failed = set(self._agent_failed_at)
        vs = [self.k8s.get(who(c), NO_VIEW) for c in self.containers
              if not failed or POD in failed or who(c) in failed]
        return any(v.phase == PULLING and v.attempt > v.failures >= 1 for v in vs) or (
            bool(vs) and all(v.phase == PULLED for v in vs))

    def agent_failure_stale(self, obj: Mapping[str, Any]) -> bool:
        """The agent's Failed for ``obj``'s container is from an earlier attempt."""
        w = self.who_of(obj)
        v = self.view_of(w)
        at = self._agent_failed_at.get(w)
        return at is not None and v.phase == PULLING and v.attempt > at

    def _note_agent_phase(self, w: Who, phase: str) -> None:
        if phase == "Failed":
            self._agent_failed_at.setdefault(w, self.view_of(w).attempt)
        elif phase not in IDLE_PHASES:
            self._agent_failed_at.pop(w, None)

    def _idle(self, obj: Mapping[str, Any]) -> bool:
        phase = obj.get("phase")
        return phase in IDLE_PHASES or (phase == "Failed" and self.agent_failure_stale(obj))

    def queued(self, obj: Mapping[str, Any]) -> bool:
        """kubelet is pulling this image but the runtime shows nothing yet."""
        v = self.view_of(self.who_of(obj))
        return (v.phase == PULLING and self._idle(obj)
                and int(obj.get("progress") or 0) <= 0)

    def _own(self, pull: Mapping[str, Any]) -> bool:
        """A pull of this pod's own images (it shows nothing of another tenant's)."""
        images = set(pull.get("images") or [])
        if images:
            return images <= self._own_images
        repos = set(pull.get("repositories") or [])
        return bool(repos) and repos <= self._own_repos

    def others_pulling(self) -> bool:
        """The node view holds pulls that are not this pod's."""
        return any(not self._own(p) for p in (self.node_view or {}).get("pulls") or []
                   if isinstance(p, Mapping))

    def _pulled_images(self) -> set[str]:
        return {str(r) for c in self.containers
                if self.k8s.get(who(c), NO_VIEW).phase == PULLED
                and (r := _ref(c.image)) is not None}

    def _waiting_for(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """:meth:`waiting` for an object's image; a pod granularity object (no image)
        waits when an image of the pod that kubelet is pulling does."""
        if obj.get("image"):
            return self.waiting(str(obj["image"]))
        for c in self.containers:
            if self.k8s.get(who(c), NO_VIEW).phase == PULLING:
                w = self.waiting(c.image)
                if w is not None:
                    return w
        return None

    def waiting(self, image: str) -> dict[str, Any] | None:
        """The node's pull slots are all taken by pulls of other images. A pull that
        names no image yet (no manifest fetched) may be this image's own, just
        starting: it does not count as another's."""
        nv = self.node_view
        if not nv:
            return None
        free = nv.get("slotsFree")
        if free is None or free > 0:
            return None
        ref = _ref(image)
        pulls = [p for p in nv.get("pulls") or [] if isinstance(p, Mapping)]
        if ref is None:
            return None
        repo = f"{ref.host}/{ref.path}"
        # kubelet said Pulled for these: a pull of them still on the node view is the
        # agent's view lagging (its lease not yet released), not a slot in use.
        pulled = self._pulled_images()
        others = [p for p in pulls
                  if ((p.get("images") and str(ref) not in p["images"])
                      or (not p.get("images") and p.get("repositories")
                          and repo not in p["repositories"]))
                  and not (p.get("images") and set(p["images"]) <= pulled)]
        if any(str(ref) in (p.get("images") or []) for p in pulls):
            return None  # the busy slot is this image's own pull, just starting
        slots = slots_of(nv)
        if not others or (slots["limit"] is not None and len(others) < slots["limit"]):
            return None
        count = nv.get("inFlight")
        return {"inFlight": [p for p in pulls if self.see_node_pulls or self._own(p)],
                "inFlightCount": count if isinstance(count, int) else len(pulls),
                "limit": slots["limit"], "slots": slots}

    def _present_phase(self, w: Who) -> str | None:
        """present_phase for one container or image volume, or for the pod (POD): Done
        when any of its images was pulled for it and kubelet has them all."""
        phases = [present_phase(self.k8s.get(n, NO_VIEW)) for n in self._whos(w)]
        if "Done" in phases and all(p is not None for p in phases):
            return "Done"
        return None

    def pulls_began(self) -> dict[int, float]:
        """When each container's (or image volume's) own pull began, by its index in
        ``containers`` (kubelet's Pulled): the agent counts a present layer of its
        image committed since as brought by that pull, as the stream that watched it
        did. One whose image kubelet found present, or still pulls, has none."""
        return {i: v.pull_began for i, c in enumerate(self.containers)
                if (v := self.k8s.get(who(c), NO_VIEW)).phase == PULLED
                and v.pull_began is not None}

    def _summary(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        out = {**unknown_to_null(obj), "complete": True}
        images = [dict(i) for i in obj.get("images") or () if isinstance(i, Mapping)]
        for i in images:
            if i.get("phase") == "AlreadyPresent" and \
                    self._present_phase(self.who_of(i)) == "Done":
                i["phase"] = "Done"
        if images:
            out["images"] = images
            if out.get("phase") == "AlreadyPresent" and any(
                    i.get("phase") == "Done" for i in images):
                out["phase"] = "Done"
        return out

    def apply(self, obj: dict[str, Any], w: Who | None = None) -> dict[str, Any]:
        """``obj`` merged; ``w``: whose pull it is, when the caller knows (else the
        object's container name and image tell)."""
        kind = obj.get("kind")
        if kind == "Summary":
            return self._summary(obj)
        if kind != "Progress":
            return obj
        out = unknown_to_null(obj)
        w = w or self.who_of(obj)
        phase = str(obj.get("phase") or "")
        self._note_agent_phase(w, phase)
        v = self.view_of(w)
        out["attempt"] = v.attempt
        if v.failed and (phase in IDLE_PHASES or phase == "Failed"):
            # (when the runtime shows bytes moving or the image there, that is a newer
            # attempt than kubelet's failure: the runtime's phase stands)
            out.update(phase=v.phase, error=v.error)
            if v.back_off_seconds is not None:
                out["backOffSeconds"] = v.back_off_seconds
            return out
        if phase == "AlreadyPresent" and self._pull_ahead(w):
            # Present, but kubelet pulls again: the runtime has shown nothing new yet.
            out.update(phase="Pulling" if v.phase == PULLING else PENDING)
            return out
        if phase == "AlreadyPresent" and not obj.get("layer") \
                and self._present_phase(w) == "Done":
            # This pod's own pull brought it (kubelet says so); an agent that did not
            # watch that pull finds it already there.
            out["phase"] = "Done"
            return out
        if v.phase == PULLING and self._idle(obj):
            # kubelet pulls; the runtime shows no bytes of this image (or layer) yet.
            # (Not Pending, which is "kubelet has not asked": a pull never goes back.)
            out.update(phase="Pulling", error="")
            if self.queued(obj):
                waiting = self._waiting_for(obj)
                if waiting is not None:
                    out.update(phase=WAITING, waiting=waiting)
            return out
        if v.phase == PULLED and phase in IDLE_PHASES:
            # kubelet's Pulled is ahead of the runtime's view (the agent looks every
            # quarter second): kubelet has the image. A pull never goes back to Pending.
            out["phase"] = "Pulling" if obj.get("layer") else present_phase(v) or "Done"
            return out
        if phase == WAITING or (v.phase == "" and phase in IDLE_PHASES):
            # kubelet has not asked for this image yet: Waiting is only ever "at the
            # node's pull limit".
            out["phase"] = PENDING
        return out
