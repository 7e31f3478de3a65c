"""The HTTP side of podimagepulls and nodeimagepulls: get, list and watch, with
selectors, resourceVersions and Table output. Authorization happened before
(routes.py declares it) on the same parse of the request (``RequestInfo``: verb,
name, field selector); this only reads the shared feeds. The list options are read
in ``params.py``, a watch is served by ``watch.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aggapi import GROUP, GROUP_VERSION
from aggapi.apiserver.collections import listbody, nodeimagepulls, paging, podimagepulls
from aggapi.apiserver.collections.feeds import Feed
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.collections.params import EXACT, list_options
from aggapi.apiserver.collections.selectors import FieldTerm, Selector, selector
from aggapi.apiserver.collections.store import Collection
from aggapi.apiserver.collections.store import Obj as Stored
from aggapi.apiserver.collections.table import (
    include_object,
    row_of,
    table,
    table_envelope,
    table_version,
)
from aggapi.apiserver.collections.watch import Encoder, WatchSettings, serve_watch
from aggapi.apiserver.fieldselector import exact_match
from aggapi.apiserver.replicas import FORWARDED
from aggapi.apiserver.requestinfo import INFO, RequestInfo
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.status import StatusError, not_found

# kube-apiserver's words for a version its storage no longer has (etcd3's compaction).
LIST_TOO_OLD = "The resourceVersion for the provided list is too old."
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


def _selector(res: Resource, info: RequestInfo, query: Mapping[str, str]) -> Selector:
    """The labelSelector, the request's one parse of the fieldSelector (the one
    authorization read), and the path's scope."""
    if info.verb == "watch" and info.name and info.fields \
            and exact_match(info.fields, "metadata.name") != info.name:
        raise StatusError(400, "fieldSelector metadata.name doesn't match requested name")
    sel = selector(query.get("labelSelector") or "", info.fields, res.fields)
    scope = []
    if info.name:  # GET or watch of one object: kube watches it as metadata.name=name
        scope.append(FieldTerm("metadata.name", info.name, True))
    if res.namespaced and info.namespace:
        scope.append(FieldTerm("metadata.namespace", info.namespace, True))
    return Selector(sel.labels, sel.fields + tuple(scope), res.fields)


class CollectionHandler:
    """get/list/watch of one collection resource over the shared feeds."""

    def __init__(self, res: Resource, feeds: Feeds, lifecycle: Lifecycle,
                 settings: WatchSettings | None = None) -> None:
        self.res, self.feeds, self.lifecycle = res, feeds, lifecycle
        self.settings = settings or WatchSettings()

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
        began = time.monotonic()
        info = request[INFO]
        query = request.query
        version = table_version(request.headers.get("Accept", ""))
        include = include_object(query)
        sel = _selector(self.res, info, query)
        # A get reads no list options (kube-apiserver's GetOptions: nothing that matters
        # for a derived object).
        opts = list_options(query if info.verb != "get" else {}, watch=info.verb == "watch")
        rv = opts.rv
        namespace = info.namespace if self.res.namespaced else ""
        if opts.watch:
            enc = Encoder(self.res.kind, self.res.columns, self.res.cells, version, include)
            async with self._feed(namespace, rv) as feed:
                await feed.ready()
                if rv is not None:  # a version from the future: 504 after ~3 s
                    await feed.collection.wait_reached(rv)
                return await serve_watch(request, feed.collection, sel, opts, enc,
                                         self.lifecycle, self.res.name, self.settings,
                                         forwarded=FORWARDED in request.headers)
        req = paging.page_request(query if info.verb != "get" else {}, rv)
        if opts.match == EXACT and rv is not None and req.rv is None:
            # The state at exactly rv, rebuilt from the history (410 once it no longer
            # covers rv, with kube-apiserver's words for a list).
            req = paging.PageRequest(req.limit, rv, None)
        async with self._feed(namespace, rv if req.rv is None else req.rv) as feed:
            await feed.ready()
            col = feed.collection
            if rv is not None:
                await col.wait_reached(rv)  # a version from the future: 504 after ~3 s
            try:
                state, at = paging.state_of(col, req)
            except StatusError as err:
                if err.code == 410 and req.after is None:
                    raise StatusError(410, LIST_TOO_OLD, reason="Expired") from None
                raise
            page = await self._page(col, state, col.rv if at is None else at, sel, req,
                                    count_remaining=not (query.get("labelSelector")
                                                         or query.get("fieldSelector")))
            objs, current = page.items, str(page.rv)
        if info.verb == "get":  # the object's own path (a list by name stays a list)
            if not objs:
                raise not_found(self.res.name, info.name, group=GROUP)
            if version is not None:
                return web.json_response(self._table(objs, version, include, current))
            return web.json_response(objs[0])
        # Thousands of objects take a while to encode: off the event loop, a slice at a
        # time (stored objects are replaced, never changed, so another thread may read
        # them).
        if version is not None:
            envelope = table_envelope(self.res.columns, version, current)
            key, render = "rows", row_of(self.res.cells, version, include)
        else:
            envelope = {"apiVersion": GROUP_VERSION, "kind": self.res.list_kind}
            key, render = "items", None
        envelope["metadata"] = {**(envelope.get("metadata") or {}), **paging.list_meta(page)}
        return await listbody.respond(request, envelope, key, objs, render, began)

    @staticmethod
    async def _page(col: Collection, state: Mapping[Hashable, Stored], rv: int, sel: Selector,
                    req: paging.PageRequest, *, count_remaining: bool) -> paging.Page:
        """The page of ``state`` (the objects at ``rv``; the live ones when ``rv`` is
        the collection's). A kept state's sorted selection is reused; otherwise it is
        sorted, off the event loop when big (50,000 objects: ~0.3 s)."""
        selection = (sel.labels, sel.fields)
        kept = col.kept_order(rv, selection)
        if kept is not None:
            selected = kept
        else:
            if state is col.objects:
                state = dict(state)  # the loop changes the live objects meanwhile
            objs = list(state.values())
            selected = await asyncio.to_thread(paging.order, objs, sel.matches) \
                if len(objs) > listbody.INLINE else paging.order(objs, sel.matches)
        page = paging.cut(selected, req, rv, count_remaining=count_remaining)
        if page.cont:  # the next pages read this state, whatever changes meanwhile
            col.keep_state(rv, state)
            col.keep_order(rv, selection, selected)
        return page

    def _table(self, objs: Sequence[Obj], version: str, include: str, rv: str) -> dict[str, Any]:
        return table(objs, self.res.columns, self.res.cells, version=version,
                     include=include, resource_version=rv)
