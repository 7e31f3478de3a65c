"""The objects a progress stream carries besides the agent's: their keys and the
ones this server writes itself (Error, Timeout)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aggapi.apiserver.imagepullprogress.fanout import SharedStreams
from aggapi.auth.capability import ContainerRef

# Readers wake at most this often: one agent poll's objects go out in one write.
FANOUT_LINGER = 0.03


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def timeout(why: str, resume: str) -> dict[str, Any]:
    return {"kind": "Timeout", "message": why, "resume": resume, "time": now()}


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (str(obj.get("kind")), str(obj.get("container") or ""),
            str(obj.get("image") or ""), str(obj.get("layer") or ""))


def unknown_to_null(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with unknown byte counts as null, whether the agent said -1 (older
    agents) or null: KEP-5334's clients compute sum(progress)/sum(total)."""
    out = dict(obj)
    for k in ("progress", "total"):
        v = out.get(k)
        if k in out and (v is None or isinstance(v, bool) or not isinstance(v, int)
                         or v < 0):
            out[k] = None
    return out


def is_terminal(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") in ("Summary", "Error")


PRESENT = ("Done", "AlreadyPresent")
# What a set of phases adds up to: a failure first, then the most advanced activity.
_PRECEDENCE = ("Failed", "BackOff", "Downloading", "Extracting", "Resolving", "Pulling",
               "Waiting", "Pending", "Unscheduled", "Unknown")


def overall_phase(phases: Sequence[str]) -> str:
    if phases and all(p in PRESENT for p in phases):
        return "AlreadyPresent" if all(p == "AlreadyPresent" for p in phases) else "Done"
    for p in _PRECEDENCE:
        if p in phases:
            return p
    return "Unknown"


def snapshot_summary(containers: Sequence[ContainerRef],
                     objs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The Summary that ends a stream whose images are not all present (a follow=false
    snapshot, an unscheduled pod): ``complete`` false, each image's phase as sent."""
    progress = list(objs)
    by_container: dict[str, list[str]] = {}
    layers: dict[tuple[str, str], Mapping[str, Any]] = {}
    for o in progress:
        by_container.setdefault(str(o.get("container") or ""), []).append(
            str(o.get("phase") or "Unknown"))
        layers[(str(o.get("image") or ""), str(o.get("layer") or ""))] = o
    images = [{"container": c.name, "image": c.image,
               "phase": overall_phase(by_container.get(c.name) or by_container.get("") or [])}
              for c in containers]
    need = [o for o in layers.values() if o.get("phase") != "AlreadyPresent"]
    known = all(isinstance(o.get("total"), int) and isinstance(o.get("progress"), int)
                and o["total"] >= 0 and o["progress"] >= 0 for o in need)
    phase = overall_phase([i["phase"] for i in images])
    return {"kind": "Summary", "phase": phase, "complete": phase in PRESENT,
            "progress": sum(o["progress"] for o in need) if known else None,
            "total": sum(o["total"] for o in need) if known else None,
            "images": images, "time": now()}


def crashed(exc: BaseException) -> dict[str, Any]:
    return {"kind": "Error", "phase": "Unknown", "time": now(),
            "error": f"internal error following the pull: {type(exc).__name__}"}


def new_progress_streams() -> SharedStreams:
    """The registry of shared producers: clients asking the same thing share one."""
    return SharedStreams(key_of=object_key, is_terminal=is_terminal, on_crash=crashed,
                         linger=FANOUT_LINGER)
