"""The HTTP side of podimagepulls and nodeimagepulls: get, list and watch, with
selectors, resourceVersions and Table output. Authorization happened before
(routes.py declares it); this only reads the shared feeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aggapi import GROUP, GROUP_VERSION
from aggapi.apiserver.collections import nodeimagepulls, paging, podimagepulls
from aggapi.apiserver.collections.feeds import Feed
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.collections.selectors import FieldTerm, Selector, selector
from aggapi.apiserver.collections.store import Event, expired, parse_rv
from aggapi.apiserver.collections.table import include_object, table, table_version
from aggapi.apiserver.requestinfo import INFO, RequestInfo
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.status import StatusError, not_found, status_body

# kube-apiserver's default watch length is 30-60 min (--min-request-timeout).
DEFAULT_WATCH_SECONDS = 1800
BOOKMARK_EVERY = 15.0
ENCODE_INLINE = 200  # objects a list encodes on the event loop; more go to a thread
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
Obj = Mapping[str, Any]


@dataclass(frozen=True)
class Resource:
    name: str
    kind: str
    list_kind: str
    namespaced: bool
    fields: Mapping[str, Callable[[Obj], str]]
    columns: list[dict[str, Any]]
    cells: Callable[[Obj], list[Any]]


PODS = Resource(podimagepulls.RESOURCE, podimagepulls.KIND, podimagepulls.LIST_KIND, True,
                podimagepulls.FIELDS, podimagepulls.COLUMNS, podimagepulls.cells)
NODES = Resource(nodeimagepulls.RESOURCE, nodeimagepulls.KIND, nodeimagepulls.LIST_KIND,
                 False, nodeimagepulls.FIELDS, nodeimagepulls.COLUMNS, nodeimagepulls.cells)


def _flag(query: Mapping[str, str], name: str) -> bool:
    return (query.get(name) or "").lower() in ("1", "true")


def _selector(res: Resource, info: RequestInfo, query: Mapping[str, str]) -> Selector:
    sel = selector(query, res.fields)
    scope = []
    if info.name:  # GET or watch of one object: kube watches it as metadata.name=name
        scope.append(FieldTerm("metadata.name", info.name, True))
    if res.namespaced and info.namespace:
        scope.append(FieldTerm("metadata.namespace", info.namespace, True))
    return Selector(sel.labels, sel.fields + tuple(scope), res.fields)


class CollectionHandler:
    """get/list/watch of one collection resource over the shared feeds."""

    def __init__(self, res: Resource, feeds: Feeds, lifecycle: Lifecycle) -> None:
        self.res, self.feeds, self.lifecycle = res, feeds, lifecycle

    @contextlib.asynccontextmanager
    async def _feed(self, namespace: str, rv: int | None = None) -> AsyncIterator[Feed]:
        if self.res is PODS:
            async with self.feeds.pods_of(namespace, rv) as pods:
                yield pods
            return
        if self.feeds.nodes is None:
            raise StatusError(503, "no agent credentials configured: node image pulls "
                                   "are not served", retry_after=30)
        async with self.feeds.nodes.use("") as nodes:
            yield nodes

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO]
        query = request.query
        version = table_version(request.headers.get("Accept", ""))
        include = include_object(query)
        sel = _selector(self.res, info, query)
        rv = parse_rv(query.get("resourceVersion"))
        if info.verb == "watch" or _flag(query, "watch"):
            return await self._watch(request, sel, rv, version, include)
        req = paging.page_request(query if info.verb != "get" else {}, rv)
        async with self._feed(info.namespace if self.res.namespaced else "",
                              rv if req.rv is None else req.rv) as feed:
            await feed.ready()
            col = feed.collection
            if rv is not None:
                await col.wait_reached(rv)  # a version from the future: 504 after ~3 s
            state, at = paging.state_of(col, req)
            page = paging.cut(state.values(), sel.matches, req,
                              col.rv if at is None else at,
                              count_remaining=not (query.get("labelSelector")
                                                   or query.get("fieldSelector")))
            objs, current = page.items, str(page.rv)
        if info.verb == "get":  # the object's own path (a list by name stays a list)
            if not objs:
                raise not_found(self.res.name, info.name, group=GROUP)
            if version is not None:
                return web.json_response(self._table(objs, version, include, current))
            return web.json_response(objs[0])
        body: dict[str, Any] = self._table(objs, version, include, current) \
            if version is not None else {
                "apiVersion": GROUP_VERSION, "kind": self.res.list_kind, "items": objs}
        body["metadata"] = {**(body.get("metadata") or {}), **paging.list_meta(page)}
        # Thousands of objects take a while to encode: off the event loop (stored
        # objects are replaced, never changed, so another thread may read them).
        text = await asyncio.to_thread(json.dumps, body) if len(objs) > ENCODE_INLINE \
            else json.dumps(body)
        return web.Response(text=text, content_type="application/json")

    def _table(self, objs: Sequence[Obj], version: str, include: str, rv: str) -> dict[str, Any]:
        return table(objs, self.res.columns, self.res.cells, version=version,
                     include=include, resource_version=rv)

    def _encode(self, kind: str, obj: Obj, version: str | None, include: str) -> bytes:
        if version is not None and kind != "BOOKMARK" and kind != "ERROR":
            obj = self._table([obj], version, include,
                              str((obj.get("metadata") or {}).get("resourceVersion") or ""))
        return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"

    def _bookmark(self, rv: int, *, initial_end: bool = False) -> Obj:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return {"kind": self.res.kind, "apiVersion": GROUP_VERSION, "metadata": meta}

    async def _watch(self, request: web.Request, sel: Selector, rv: int | None,
                     version: str | None, include: str) -> web.StreamResponse:
        info, query = request[INFO], request.query
        try:
            seconds = float(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
        except ValueError:
            raise StatusError(400, "timeoutSeconds must be a number") from None
        bookmarks = _flag(query, "allowWatchBookmarks") and version is None
        send_initial = _flag(query, "sendInitialEvents")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        async with self._feed(info.namespace if self.res.namespaced else "", rv) as feed:
            await feed.ready()
            col = feed.collection
            if rv is not None:
                await col.wait_reached(rv)  # a version from the future: 504 after ~3 s
            from_state = rv is None or send_initial
            if rv is not None and not send_initial:
                col.check_rv(rv)  # 410 Expired before any byte: the client relists
            resp = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "Cache-Control": "no-cache",
                                               "X-Accel-Buffering": "no"})
            await resp.prepare(request)
            out: list[bytes] = []
            if from_state:
                # "Start at the most recent": the current state as ADDED first.
                for obj in col.objects.values():
                    if sel.matches(obj):
                        out.append(self._encode("ADDED", obj, version, include))
                pos = col.rv
                if send_initial and bookmarks:
                    out.append(self._encode("BOOKMARK", self._bookmark(pos, initial_end=True),
                                            None, include))
            else:
                assert rv is not None
                pos = rv
            if out:
                await resp.write(b"".join(out))
            bookmark_at = loop.time() + BOOKMARK_EVERY
            async with self.lifecycle.track(self.res.name) as shutdown:
                while not (shutdown.is_set() or self.lifecycle.draining.is_set()):
                    left = deadline - loop.time()
                    if left <= 0:
                        break
                    try:
                        events = col.since(pos)
                    except StatusError:
                        await resp.write(self._encode(
                            "ERROR", status_body(410, expired(pos).message, reason="Expired"),
                            None, include))
                        break
                    if events:
                        chunk = self._events(events, sel, version, include)
                        pos = events[-1].rv
                        if chunk:
                            await resp.write(chunk)
                        continue
                    if bookmarks and loop.time() >= bookmark_at:
                        await resp.write(self._encode("BOOKMARK", self._bookmark(pos), None,
                                                      include))
                        bookmark_at = loop.time() + BOOKMARK_EVERY
                    await col.wait(pos, min(left, 1.0))
        await resp.write_eof()
        return resp

    def _events(self, events: list[Event], sel: Selector, version: str | None,
                include: str) -> bytes:
        """The events this watcher sees, judged on the object before and after as
        kube-apiserver's watch cache does: one leaving the selection is DELETED for
        it, one entering it ADDED."""
        out = []
        for ev in events:
            if ev.type == "DELETED":
                was, now = sel.matches(ev.obj), False
            else:
                was = ev.prev is not None and sel.matches(ev.prev)
                now = sel.matches(ev.obj)
            if now:
                kind = "MODIFIED" if was else "ADDED"
            elif was:
                kind = "DELETED"
            else:
                continue
            out.append(self._encode(kind, ev.obj, version, include))
        return b"".join(out)
