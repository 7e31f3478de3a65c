"""The objects a progress stream carries besides the agent's: their keys and the
ones this server writes itself (Error, Timeout)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from aggapi.apiserver.imagepullprogress.fanout import SharedStreams

# Readers wake at most this often: one agent poll's objects go out in one write.
FANOUT_LINGER = 0.03


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def timeout(why: str, resume: str) -> dict[str, Any]:
    return {"kind": "Timeout", "message": why, "resume": resume, "time": now()}


def object_key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (str(obj.get("kind")), str(obj.get("container") or ""),
            str(obj.get("image") or ""), str(obj.get("layer") or ""))


def is_terminal(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") in ("Summary", "Error")


def crashed(exc: BaseException) -> dict[str, Any]:
    return {"kind": "Error", "phase": "Unknown", "time": now(),
            "error": f"internal error following the pull: {type(exc).__name__}"}


def new_progress_streams() -> SharedStreams:
    """The registry of shared producers: clients asking the same thing share one."""
    return SharedStreams(key_of=object_key, is_terminal=is_terminal, on_crash=crashed,
                         linger=FANOUT_LINGER)
