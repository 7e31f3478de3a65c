"""Follow a pod's image pulls: NDJSON objects from pods/imagepullprogress.

The stream runs on the ``/watch/`` path, which kube-apiserver treats as
long-running (no 60 s cut). Every object is a full snapshot of one
(container, image, layer), so resuming is simply reconnecting: after a cut
connection, a clean end without a final object, or a ``Timeout`` object (the
plain path's early end), the client asks again and the server resends the
current state. A stream is over at ``Summary`` (every image present) or
``Error``; both are yielded to the caller.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from aggapi.client.connection import Connection, subresource_path
from aggapi.client.errors import TransferError, error_from_status
from aggapi.client.retry import CATCH, Backoff, wait_or_raise

FINAL_KINDS = ("Summary", "Error")
PRESENT_PHASES = ("Done", "AlreadyPresent")
Obj = dict[str, Any]
OnRetry = Callable[[BaseException, float], None]


def _parse(line: bytes) -> Obj | None:
    line = line.strip()
    if line.startswith(b"data:"):  # tolerate SSE framing from a proxy that chose it
        line = line[5:].strip()
    if not line or line.startswith((b":", b"event:", b"id:", b"retry:")):
        return None
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise TransferError.from_message(f"malformed progress line: {line[:200]!r}") from exc
    if not isinstance(obj, dict):
        raise TransferError.from_message(f"progress line is not an object: {line[:200]!r}")
    return obj


async def watch_progress(conn: Connection, pod: str, *, namespace: str | None = None,
                         containers: Sequence[str] = (), granularity: str = "layer",
                         follow: bool = True, backoff: Backoff | None = None,
                         on_retry: OnRetry | None = None) -> AsyncIterator[Obj]:
    """Yield progress objects until ``Summary``/``Error`` (or, without follow, the end
    of the snapshot). Typed errors: the request was refused, or retries ran out."""
    ns = namespace or conn.namespace
    path = subresource_path(ns, pod, "imagepullprogress", watch=True)
    params = [("container", c) for c in containers]
    params += [("granularity", granularity), ("follow", "true" if follow else "false")]
    backoff = backoff or Backoff()
    while True:
        try:
            moved = False
            async with conn.request("GET", path, params=params,
                                    headers={"Accept": "application/json"}) as resp:
                async for line in resp.content:
                    obj = _parse(line)
                    if obj is None:
                        continue
                    kind = obj.get("kind")
                    if kind == "Status":
                        raise error_from_status(int(obj.get("code") or 500), obj)
                    if kind == "Timeout":
                        # Only the plain path is cut early; move to the long-running one.
                        resume = obj.get("resume")
                        if isinstance(resume, str) and resume.startswith("/apis/"):
                            path = resume
                        moved = True
                        break
                    backoff.progressed()
                    yield obj
                    if kind in FINAL_KINDS:
                        return
            if moved:
                continue
            if not follow:
                return
            raise TransferError.from_message("progress stream ended before a final object")
        except CATCH as exc:
            await wait_or_raise(backoff, exc, on_retry)


def all_present(summary: Obj) -> bool:
    """Whether a Summary object says every image of the pod is present."""
    images = summary.get("images") or []
    return all(i.get("phase") in PRESENT_PHASES for i in images) and \
        summary.get("phase") in (*PRESENT_PHASES, None)
