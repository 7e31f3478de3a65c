"""The pod's view of node state: NDJSON objects at layer, image or pod granularity.

Every progress object carries KEP-5334's fields (image, layer, progress, total,
error) plus container, phase, bytesPerSecond, etaSeconds and time, and
``kind: "Progress"``. A stream ends with ``kind: "Summary"`` once every image is
present, or ``kind: "Error"``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from aggapi.agent.progress import model as phase
from aggapi.agent.progress.eta import share_rate
from aggapi.agent.progress.model import ImageState, NodeState
from aggapi.auth.capability import ContainerRef

GRANULARITIES = ("layer", "image", "pod")
Obj = dict[str, Any]


def rfc3339(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def _obj(*, image: str, layer: str, progress: int | None, total: int | None, error: str,
         container: str,
         phase: str, rate: float | None, eta_s: float | None, t: float) -> Obj:
    return {"kind": "Progress", "image": image, "layer": layer, "progress": progress,
            "total": total, "error": error, "container": container, "phase": phase,
            "bytesPerSecond": rate, "etaSeconds": eta_s, "time": rfc3339(t)}


def _image_of(state: NodeState, c: ContainerRef) -> ImageState:
    return state.images.get(c.image) or ImageState(c.image, phase.UNKNOWN)


def pod_phase(phases: Sequence[str]) -> str:
    if not phases:
        return phase.UNKNOWN
    if phase.FAILED in phases:
        return phase.FAILED
    if all(p in phase.TERMINAL for p in phases):
        present = all(p == phase.ALREADY_PRESENT for p in phases)
        return phase.ALREADY_PRESENT if present else phase.DONE
    for p in (phase.DOWNLOADING, phase.EXTRACTING, phase.RESOLVING, phase.WAITING):
        if p in phases:
            return p
    return phase.UNKNOWN


def _sums(need: Sequence[ImageState]) -> tuple[int | None, int | None]:
    prog = [s.progress for s in need]
    total = [s.total for s in need]
    if any(x is None for x in prog + total):
        return None, None
    return sum(x for x in prog if x is not None), sum(x for x in total if x is not None)


def _pod_rate(state: NodeState, need: Sequence[ImageState]) -> float | None:
    """The rate of the pod's bytes (its images' layers together, over one window):
    never a sum of per-image figures, never above the node's link."""
    busy = [s for s in need if s.phase in (phase.DOWNLOADING, phase.EXTRACTING)]
    if state.rates is None or not busy:
        return None
    mine = [la.digest for s in busy for la in s.layers if la.phase != phase.ALREADY_PRESENT]
    rate = share_rate(mine, state.shares, state.rates) if state.shares else None
    if rate is None:
        rate = state.rates.group(mine)
    cap = state.link_bytes_per_second if state.room is None else state.room
    if rate is not None and cap is not None:
        rate = min(rate, cap)
    return None if rate is None else round(rate, 1)


def _pod_eta(need: Sequence[ImageState]) -> float | None:
    """Its last image's ETA; unknown while any image still to come has none."""
    etas = [s.eta_seconds for s in need if s.phase not in phase.TERMINAL]
    if not etas or any(e is None for e in etas):
        return None
    return max(e for e in etas if e is not None)


def objects(containers: Sequence[ContainerRef], state: NodeState, granularity: str) -> list[Obj]:
    t = state.time
    out: list[Obj] = []
    if granularity == "pod":
        imgs: dict[str, ImageState] = {}
        for c in containers:
            st = _image_of(state, c)
            imgs.setdefault(st.root_digest or st.ref, st)
        need = [s for s in imgs.values() if s.phase != phase.ALREADY_PRESENT]
        prog, total = _sums(need)
        errors = "; ".join(s.error for s in imgs.values() if s.error)
        out.append(_obj(image="", layer="", progress=prog, total=total, error=errors,
                        container="", phase=pod_phase([s.phase for s in imgs.values()]),
                        rate=_pod_rate(state, need), eta_s=_pod_eta(need), t=t))
        return out
    for c in containers:
        st = _image_of(state, c)
        if granularity == "image" or not st.layers:
            out.append(_obj(image=c.image, layer="", progress=st.progress, total=st.total,
                            error=st.error, container=c.name, phase=st.phase,
                            rate=st.bytes_per_second, eta_s=st.eta_seconds, t=t))
            continue
        for la in st.layers:
            o = _obj(image=c.image, layer=la.digest, progress=la.progress,
                     total=la.total, error=st.error if la.phase == phase.FAILED else "",
                     container=c.name, phase=la.phase, rate=la.bytes_per_second,
                     eta_s=la.eta_seconds, t=t)
            # The manifest (or index) the layer is of: a re-pull of a tag that moved
            # replaces the image's layers, and the apiserver drops the old ones by it.
            o["manifest"] = st.root_digest
            out.append(o)
    return out


def key(o: Obj) -> tuple[str, str, str]:
    return (o.get("container", ""), o.get("image", ""), o.get("layer", ""))


def without_time(o: Obj) -> Obj:
    return {k: v for k, v in o.items() if k != "time"}


def finished(containers: Sequence[ContainerRef], state: NodeState) -> bool:
    return all(_image_of(state, c).phase in phase.TERMINAL for c in containers)


def failure(containers: Sequence[ContainerRef], state: NodeState) -> Obj | None:
    """The Error object that ends a stream, if the pod's pulls cannot be followed on."""
    if state.error:
        return {"kind": "Error", "image": "", "error": state.error, "phase": phase.UNKNOWN,
                "time": rfc3339(state.time)}
    for c in containers:
        st = _image_of(state, c)
        if st.phase == phase.FAILED:
            return {"kind": "Error", "image": c.image, "container": c.name,
                    "error": st.error, "phase": phase.FAILED, "time": rfc3339(state.time)}
    return None


def summary(containers: Sequence[ContainerRef], state: NodeState) -> Obj:
    pod = objects(containers, state, "pod")[0]
    return {"kind": "Summary", "phase": pod["phase"], "progress": pod["progress"],
            "total": pod["total"],
            "images": [{"container": c.name, "image": c.image,
                        "phase": _image_of(state, c).phase} for c in containers],
            "time": rfc3339(state.time)}
