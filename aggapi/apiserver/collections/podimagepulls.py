"""PodImagePull: one pod's image pulls as one object, and its table columns.

Built by the per-pod subresource's merge policy (``imagepullprogress.merge``): the
node view gives the bytes (one pull per repository), kubelet's events and the pod's
statuses give the phase, and the merge decides Pending / Pulling / Waiting (for a
pull slot) / Failed / BackOff exactly as the stream does. Another tenant's pulls on
the node never show: only this pod's images' own pulls are read, and the slots as
counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aggapi import GROUP_VERSION, imageref
from aggapi.apiserver.collections.kubepart import kube_part
from aggapi.apiserver.collections.table import AGE_COLUMN, age
from aggapi.apiserver.imagepullprogress.merge import Merger, present_phase
from aggapi.apiserver.imagepullprogress.objects import overall_phase
from aggapi.apiserver.imagepullprogress.pullstate import PULLED, who
from aggapi.auth.capability import ContainerRef

KIND, LIST_KIND, RESOURCE = "PodImagePull", "PodImagePullList", "podimagepulls"
PRESENT = ("Done", "AlreadyPresent")
STUCK = ("Failed", "BackOff")


def _pull_named(names: tuple[str, str] | None, view: Mapping[str, Any] | None
                ) -> Mapping[str, Any] | None:
    """The node's in-flight pull that brings the image of ``names`` (its
    ``imageref.identity``): by image when the agent named it, else by repository
    (containerd's distribution-source labels)."""
    if names is None:
        return None
    full, repo = names
    for p in (view or {}).get("pulls") or ():
        if not isinstance(p, Mapping):
            continue
        if full in (p.get("images") or ()) or (
                not p.get("images") and repo in (p.get("repositories") or ())):
            return p
    return None


def _named_on_node(same: str, view: Mapping[str, Any] | None) -> bool:
    """The node's runtime has the image ``same`` names (the agent's ``presentImages``;
    ``same``: as :func:`_same_image` names it)."""
    present = (view or {}).get("presentImages")
    return isinstance(present, list) and same in present


def _eta(progress: Any, total: Any, rate: Any) -> float | None:
    if not (isinstance(progress, int) and isinstance(total, int)
            and isinstance(rate, (int, float)) and rate > 0):
        return None
    return round(max(total - progress, 0) / rate, 1)


def _same_image(image: str) -> str:
    """Containers naming one image (init, sidecar, app, image volume) share one pull."""
    try:
        return str(imageref.parse(image))
    except imageref.InvalidReference:
        return image


def _before(previous: Mapping[str, Any] | None, container: str,
            image: str) -> Mapping[str, Any]:
    for i in ((previous or {}).get("status") or {}).get("images") or ():
        if i.get("container") == container and i.get("image") == image:
            return i
    return {}


def _kept_total(previous: Mapping[str, Any] | None, container: str,
                image: str) -> int | None:
    """The bytes this pod's pull of ``image`` brought, from the object built before
    (the node view forgets a pull once it ends; the stream keeps its totals)."""
    before = _before(previous, container, image)
    total = before.get("total")
    if before.get("phase") not in ("Resolving", "Downloading", "Extracting", "Done"):
        return None  # (the 0 of 0 of an image present before a re-pull is no total)
    return total if isinstance(total, int) and not isinstance(total, bool) else None


def _image(merger: Merger, c: ContainerRef, names: tuple[str, str] | None,
           scheduled: bool, view: Mapping[str, Any] | None,
           previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """One container's (or image volume's) image; ``names``: its image's
    ``imageref.identity``."""
    container, image, w = c.name, c.image, who(c)
    k8s = merger.view_of(w)
    pull = _pull_named(names, view) if k8s.phase != PULLED else None
    if not scheduled:
        phase = "Unscheduled"
    elif k8s.phase == PULLED:
        phase = present_phase(k8s) or "Done"
    elif pull:
        phase = str(pull.get("phase") or "Unknown")
    else:
        # Present with no pull of it under way: what the agent tells the stream (the
        # merge then says Pending when kubelet will pull it again, imagePullPolicy
        # Always), before kubelet's Pulled event.
        # (The node is not polled once every image is present: the phase seen then
        # stands until kubelet's event.)
        present = _named_on_node(names[0] if names else image, view) or (
            view is None and _before(previous, container, image).get("phase")
            == "AlreadyPresent")
        phase = "AlreadyPresent" if present else "Unknown"
    bytes_ = (pull.get("progress"), pull.get("total")) if pull else \
        (0, 0) if phase == "AlreadyPresent" and k8s.phase != PULLED else (None, None)
    raw = {"kind": "Progress", "container": container, "image": image, "layer": "",
           "phase": phase, "progress": bytes_[0], "total": bytes_[1], "error": ""}
    merged = merger.apply(raw, w) if scheduled else raw
    if merged.get("phase") == "Done" and merged.get("total") is None:
        kept = _kept_total(previous, container, image)
        merged = {**merged, "progress": kept, "total": kept}
    rate = pull.get("bytesPerSecond") if pull else None
    out: dict[str, Any] = {
        "container": container, "image": image, "phase": merged.get("phase"),
        "progress": merged.get("progress"), "total": merged.get("total"),
        "bytesPerSecond": rate if merged.get("phase") not in PRESENT + STUCK else None,
        "etaSeconds": None, "attempt": merged.get("attempt", 0),
        "waitingForSlot": merged.get("phase") == "Waiting"}
    if out["bytesPerSecond"] is not None:
        out["etaSeconds"] = _eta(out["progress"], out["total"], rate)
    waiting = merged.get("waiting")
    if isinstance(waiting, Mapping):
        out["slots"] = {"used": waiting.get("inFlightCount"), "limit": waiting.get("limit")}
    if merged.get("phase") in STUCK:
        out["reason"] = merged.get("error") or merged.get("phase")
        if merged.get("backOffSeconds") is not None:
            out["backOffSeconds"] = merged["backOffSeconds"]
    return out


def _summed(need: Sequence[Mapping[str, Any]]
            ) -> tuple[tuple[int | None, int | None], float | None, float | None]:
    """The images' (progress, total) summed when every one is known, rates summed, the
    longest ETA (in one pass: a build's own share of a rollout's loop)."""
    progress: int | None = 0
    total: int | None = 0
    rate: float | None = None
    eta: float | None = None
    for i in need:
        p, t, r, e = i["progress"], i["total"], i["bytesPerSecond"], i["etaSeconds"]
        progress = progress + p if progress is not None and isinstance(p, int) else None
        total = total + t if total is not None and isinstance(t, int) else None
        if r is not None:  # (as sum(): from 0)
            rate = (0 if rate is None else rate) + r
        if e is not None and (eta is None or e > eta):
            eta = e
    return (progress, total), rate, eta


def pod_image_pull(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
                   view: Mapping[str, Any] | None,
                   previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The PodImagePull of ``pod``: its events (any order) and its node's view merged.
    ``previous``: the object last built for this pod, whose totals a Done image keeps
    (only when it is the same pod: same uid)."""
    part = kube_part(pod, events)
    meta = pod.get("metadata") or {}
    uid = meta.get("uid", "")
    if previous is not None and (previous.get("metadata") or {}).get("uid") != uid:
        previous = None
    merger = Merger(part.containers)
    merger.restore(part.k8s, part.always)
    merger.node_view = dict(view) if view is not None else None
    images = [_image(merger, c, names, bool(part.node), view, previous)
              for c, names in zip(part.containers, part.names, strict=True)]
    # As the stream's pod granularity: each image once, however many containers (or
    # image volumes) name it, and only the images that need downloading.
    once = images if len(images) == 1 else list(
        {_same_image(str(i["image"])): i for i in reversed(images)}.values())
    sums, rate, eta = _summed([i for i in once if i["phase"] != "AlreadyPresent"])
    return {
        "apiVersion": GROUP_VERSION, "kind": KIND,
        "metadata": {"name": meta.get("name", ""), "namespace": meta.get("namespace", ""),
                     "uid": uid,
                     **({"creationTimestamp": meta["creationTimestamp"]}
                        if meta.get("creationTimestamp") else {}),
                     "labels": dict(meta.get("labels") or {})},
        "spec": {"nodeName": part.node},
        "status": {"phase": overall_phase([str(i["phase"]) for i in images]),
                   "progress": sums[0], "total": sums[1],
                   "bytesPerSecond": rate, "etaSeconds": eta,
                   "imagesPresent": sum(i["phase"] in PRESENT for i in images),
                   "images": images},
    }


def view_slice(images: Sequence[str], view: Mapping[str, Any] | None, *,
               others: bool = True) -> Any:
    """What of the node view ``pod_image_pull`` reads for a pod of ``images``: the
    pulls of its images whole, and (``others``: see :func:`reads_others`) of the
    others only which images they bring and the slot counts (whether the pod waits
    for a slot). Another pod's bytes moving leave it unchanged: the pod's object need
    not be rebuilt."""
    if view is None:
        return None
    # (read often: for every pod still pulling on a node, at each change of its view;
    # each image parsed once, and only when the view has pulls or present images)
    pulls, listed = view.get("pulls"), isinstance(view.get("presentImages"), list)
    own: list[Mapping[str, Any] | None] = []
    present: list[bool] = []
    for image in images:
        names = imageref.identity(image) if pulls or listed else None
        own.append(_pull_named(names, view) if pulls else None)
        present.append(listed and _named_on_node(names[0] if names else image, view))
    if not others:
        return own, present
    pulls = [p for p in view.get("pulls") or () if isinstance(p, Mapping)]
    return (own, present, [(p.get("images"), p.get("repositories")) for p in pulls],
            view.get("slotsFree"), view.get("inFlight"), view.get("slots"),
            view.get("kubelet"))


def reads_others(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` (built by ``pod_image_pull``) may change with the node's other
    pulls and slots: only an image kubelet pulls while the runtime shows nothing of it
    reads them (Waiting for a slot, else Pulling); no other image's phase can become
    that through a change of the others alone (kube's change or its own pull's comes
    first, and rebuilds it). A node where a pull starts or ends thus rebuilds the pods
    waiting there, not the ten that kubelet has not asked for yet."""
    return any(i.get("phase") in ("Pulling", "Waiting")
               for i in (obj.get("status") or {}).get("images") or ())


def needs_node_view(obj: Mapping[str, Any]) -> bool:
    """Bytes and slots matter while an image of the scheduled pod is not present."""
    status = obj.get("status") or {}
    return bool((obj.get("spec") or {}).get("nodeName")) and any(
        i.get("phase") not in PRESENT for i in status.get("images") or ())


FIELDS = {
    "metadata.name": lambda o: str((o.get("metadata") or {}).get("name") or ""),
    "metadata.namespace": lambda o: str((o.get("metadata") or {}).get("namespace") or ""),
    "spec.nodeName": lambda o: str((o.get("spec") or {}).get("nodeName") or ""),
}


# --- table ---------------------------------------------------------------------

COLUMNS: list[dict[str, Any]] = [
    {"name": "Name", "type": "string", "format": "name", "priority": 0,
     "description": "Name of the pod"},
    {"name": "Node", "type": "string", "format": "", "priority": 0,
     "description": "The node the pod is bound to"},
    {"name": "Images", "type": "string", "format": "", "priority": 0,
     "description": "Images present of the pod's images"},
    {"name": "Phase", "type": "string", "format": "", "priority": 0,
     "description": "The pod's pulls summed up: a failure first, then the most "
                    "advanced activity"},
    {"name": "Progress", "type": "string", "format": "", "priority": 0,
     "description": "Bytes downloaded of the bytes known, in percent"},
    {"name": "Rate", "type": "string", "format": "", "priority": 0,
     "description": "Download rate"},
    {"name": "ETA", "type": "string", "format": "", "priority": 0,
     "description": "Estimated time left"},
    AGE_COLUMN,
    {"name": "Reason", "type": "string", "format": "", "priority": 1,
     "description": "Why a pull is stuck (kubelet's or the registry's words)"},
]


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1000
    return f"{n:.1f}TB"


def human_seconds(secs: float) -> str:
    s = round(secs)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60}s"
    return f"{s // 3600}h{s % 3600 // 60}m"


def cells(obj: Mapping[str, Any]) -> list[Any]:
    status = obj.get("status") or {}
    images = status.get("images") or []
    progress, total = status.get("progress"), status.get("total")
    pct = f"{100 * progress // total}%" if isinstance(progress, int) and \
        isinstance(total, int) and total > 0 else ("100%" if status.get("phase") in PRESENT
                                                   else "-")
    rate, eta = status.get("bytesPerSecond"), status.get("etaSeconds")
    reasons = [f"{i['container']}: {i['reason']}" for i in images if i.get("reason")]
    return [(obj.get("metadata") or {}).get("name"),
            (obj.get("spec") or {}).get("nodeName") or "<none>",
            f"{status.get('imagesPresent', 0)}/{len(images)}",
            status.get("phase"), pct,
            f"{human_bytes(rate)}/s" if isinstance(rate, (int, float)) else "-",
            human_seconds(eta) if isinstance(eta, (int, float)) else "-", age(obj),
            "; ".join(reasons) or "<none>"]

