"""One list and one watch of ``podimagepulls`` for every pod image-pull-progress follows.

A workload, ``-l``, ``--node`` and ``-A`` all become one request pair on the collection
(namespaced, or all namespaces; ``fieldSelector=spec.nodeName=NODE`` for a node), so the
cost on the cluster does not grow with the pods: the server keeps one pod and one event
watch per namespace whatever the plugin follows. A watch that ends or drops is resumed
from the last resourceVersion seen (bookmarks included), for as long as it takes; a
version the server no longer has (410 Expired, as an HTTP status or an ERROR event)
means a fresh list.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from aggapi import GROUP_VERSION
from aggapi.client.connection import Connection
from aggapi.client.errors import Gone, TransferError, error_from_status
from aggapi.client.retry import CATCH, Backoff, wait_or_raise
from aggapi.plugins.targets import Target, get_json

RESOURCE = "podimagepulls"
INLINE_LINE = 64 << 10  # a watch line longer than this is parsed in a thread
Obj = dict[str, Any]
OnRetry = Callable[[BaseException, float], None]


@dataclass(frozen=True)
class Change:
    """``LIST``: ``items`` is the whole selection now (a first list or a relist);
    ``ADDED``/``MODIFIED``/``DELETED``: ``obj`` is one PodImagePull."""

    type: str
    obj: Obj | None = None
    items: tuple[Obj, ...] = ()


def collection_path(target: Target, namespace: str) -> str:
    base = f"/apis/{GROUP_VERSION}"
    if target.all_namespaces:
        return f"{base}/{RESOURCE}"
    return f"{base}/namespaces/{namespace}/{RESOURCE}"


def selector_params(target: Target) -> list[tuple[str, str]]:
    return [(k, v) for k, v in (("labelSelector", target.label_selector),
                                ("fieldSelector", target.field_selector)) if v]


def _rv(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


async def _event(line: bytes) -> Obj | None:
    line = line.strip()
    if not line:
        return None
    try:
        # Most lines are one small object: parsing them here costs less than a thread
        # hop; a long one (a pod with many images) goes to a thread.
        ev = json.loads(line) if len(line) <= INLINE_LINE else \
            await asyncio.to_thread(json.loads, line)
    except ValueError as exc:
        raise TransferError.from_message(f"malformed watch line: {line[:200]!r}") from exc
    if not isinstance(ev, dict) or not isinstance(ev.get("object"), dict):
        raise TransferError.from_message(f"watch line is not an event: {line[:200]!r}")
    return ev


async def follow_collection(conn: Connection, target: Target, namespace: str, *,
                            backoff: Backoff | None = None,
                            on_retry: OnRetry | None = None) -> AsyncIterator[Change]:
    """The selected pods' PodImagePulls: a LIST, then the watch's changes, for ever
    (the caller stops). Transient failures are retried without end, as client-go's
    reflector does: a replica going away (a reset, 503 from the aggregator, a watch
    ending empty, 504 "Too large resource version" from a replica not there yet) must
    not end the follow; ``on_retry`` tells the user. Typed errors once the server
    refuses (401, 403, 404, 400...)."""
    path = collection_path(target, namespace)
    params = selector_params(target)
    backoff = backoff or Backoff(attempts=sys.maxsize)
    rv = ""
    while True:
        try:
            if not rv:
                listing = await get_json(conn, path, params)
                rv = _rv(listing) or "0"
                items = tuple(i for i in listing.get("items") or () if isinstance(i, dict))
                backoff.progressed()
                yield Change("LIST", items=items)
            wparams = [*params, ("watch", "true"), ("allowWatchBookmarks", "true"),
                       ("resourceVersion", rv)]
            heard = False
            async with conn.request("GET", path, params=wparams,
                                    headers={"Accept": "application/json"}) as resp:
                async for line in resp.content:
                    ev = await _event(line)
                    if ev is None:
                        continue
                    heard = True
                    typ, obj = str(ev.get("type")), ev["object"]
                    if typ == "ERROR":
                        code = int(obj.get("code") or 500)
                        if code == 410:
                            rv = ""  # too old for the server's history: relist
                            break
                        raise error_from_status(code, obj)
                    rv = _rv(obj) or rv
                    backoff.progressed()
                    if typ in ("ADDED", "MODIFIED", "DELETED"):
                        yield Change(typ, obj)
            # The watch ended (timeoutSeconds, a server going away): resume from rv,
            # at once after a watch that said something, with backoff after a silent one.
            if rv and not heard:
                raise TransferError.from_message("the watch ended without an event")
        except Gone:
            rv = ""
        except CATCH as exc:
            await wait_or_raise(backoff, exc, on_retry)
