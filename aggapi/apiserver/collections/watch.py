"""Serving one collection watch: where it starts (the state first, or the changes
after a version), the events as each watcher's selector sees them, bookmarks, and
its end (timeoutSeconds, the server draining, 410 once it falls out of the history).

Memory per watcher is bounded whatever the collection holds: the initial state is
filtered and encoded in a worker thread a slice at a time, and the changes after a
version are encoded a batch at a time; each piece is written (waiting while the
client's socket is full) before the next is encoded, so a slow client holds one
piece, never the whole state or history encoded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from aggapi import GROUP_VERSION
from aggapi.apiserver.collections.params import MIN_REQUEST_TIMEOUT, ListOptions
from aggapi.apiserver.collections.selectors import Selector
from aggapi.apiserver.collections.store import Collection, Event, expired
from aggapi.apiserver.collections.table import table
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.status import StatusError, status_body

# kube-apiserver's watch cache sends a watcher a bookmark about once a minute.
BOOKMARK_EVERY = 60.0
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
ENCODE_INLINE = 200  # initial objects encoded on the event loop; more go to a thread
INITIAL_SLICE = 500  # initial objects per thread hop (and per write)
CATCH_UP_BATCH = 256  # changes taken from the history at a time
CHUNK_BYTES = 64 * 1024  # encoded bytes gathered before a write
Obj = Mapping[str, Any]


@dataclass(frozen=True)
class WatchSettings:
    bookmark_every: float = BOOKMARK_EVERY
    min_request_timeout: float = MIN_REQUEST_TIMEOUT


@dataclass(frozen=True)
class Encoder:
    """A watch's events as JSON lines: objects, or one-row Tables (kubectl's)."""
    kind: str
    columns: Sequence[Mapping[str, Any]]
    cells: Callable[[Obj], list[Any]]
    version: str | None  # the Table version asked for; None for plain objects
    include: str

    @staticmethod
    def _line(kind: str, obj: Obj) -> bytes:
        return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"

    @staticmethod
    def wrap(kind: str, text: bytes) -> bytes:
        """The line of an object already encoded as ``text`` (the same bytes)."""
        return b'{"type":"%s","object":%s}\n' % (kind.encode(), text)

    def event(self, kind: str, obj: Obj) -> bytes:
        if self.version is not None:
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            obj = table([obj], self.columns, self.cells, version=self.version,
                        include=self.include, resource_version=rv)
        return self._line(kind, obj)

    def added(self, objs: Sequence[Obj], sel: Selector) -> bytes:
        """The objects of ``objs`` ``sel`` matches, as ADDED (safe in a thread: stored
        objects are replaced, never changed)."""
        return b"".join(self.event("ADDED", o) for o in objs if sel.matches(o))

    def bookmark(self, rv: int, *, initial_end: bool = False) -> bytes:
        """Only metadata.resourceVersion (and the end-of-initial-events annotation)."""
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        return self._line("BOOKMARK", {"kind": self.kind, "apiVersion": GROUP_VERSION,
                                       "metadata": meta})

    def error(self, err: StatusError) -> bytes:
        return self._line("ERROR", status_body(err.code, err.message, reason=err.reason))


def _seen_as(ev: Event, sel: Selector) -> str | None:
    """The event this watcher sees, judged on the object before and after as
    kube-apiserver's watch cache does: one leaving the selection is DELETED for it,
    one entering it ADDED; None when it never matched."""
    if ev.type == "DELETED":
        was, now = sel.matches(ev.obj), False
    else:
        was = ev.prev is not None and sel.matches(ev.prev)
        now = sel.matches(ev.obj)
    if now:
        return "MODIFIED" if was else "ADDED"
    return "DELETED" if was else None


def _seen_by_all(ev: Event) -> str:
    """``_seen_as`` for a selector that matches every object (no labels, no fields: the
    followers' mirrors, informers of the whole collection), without matching anything:
    each change goes to every watcher, thousands a second in a rollout."""
    if ev.type == "DELETED":
        return "DELETED"
    return "MODIFIED" if ev.prev is not None else "ADDED"


async def _send_changes(resp: web.StreamResponse, events: Sequence[Event], sel: Selector,
                        enc: Encoder) -> None:
    out: list[bytes] = []
    size = 0
    every = not sel.labels and not sel.fields
    for ev in events:
        kind = _seen_by_all(ev) if every else _seen_as(ev, sel)
        if kind is None:
            continue
        if enc.version is not None:  # a one-row Table: this watcher's own
            line = enc.event(kind, ev.obj)
        elif ev.text:  # the object encoded once for every plain watcher
            line = enc.wrap(kind, ev.text)
        else:
            line = enc.event(kind, ev.obj)
        out.append(line)
        size += len(line)
        if size >= CHUNK_BYTES:
            await resp.write(b"".join(out))
            out, size = [], 0
    if out:
        await resp.write(b"".join(out))


async def _send_state(resp: web.StreamResponse, objs: Sequence[Obj], sel: Selector,
                      enc: Encoder) -> None:
    off_loop = len(objs) > ENCODE_INLINE
    for i in range(0, len(objs), INITIAL_SLICE):
        part = objs[i:i + INITIAL_SLICE]
        data = await asyncio.to_thread(enc.added, part, sel) if off_loop \
            else enc.added(part, sel)
        if data:
            await resp.write(data)


async def serve_watch(request: web.Request, col: Collection, sel: Selector,
                      opts: ListOptions, enc: Encoder, lifecycle: Lifecycle, name: str,
                      settings: WatchSettings, *, forwarded: bool = False
                      ) -> web.StreamResponse:
    """The watch ``opts`` asks for, on ``col`` (its feed held and ready by the caller).
    ``forwarded`` (by another replica, or its mirror): kept while this replica drains,
    until its term closes, as its changes go on until then."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.watch_seconds(settings.min_request_timeout)
    # kubectl's Table watches ask for none; a one-row Table has no place for them.
    bookmarks = opts.bookmarks and enc.version is None
    state: list[Obj] | None = None
    net: list[Event] = []
    net_rv: int | None = None
    if opts.send_initial:
        state = list(col.objects.values())
    elif opts.rv is None:
        pass  # sendInitialEvents=false from no particular version: from now, no state
    elif not col.owns(opts.rv):
        # Past the history: each object's net change since a paged list's kept state,
        # else 410 Expired before any byte (the client relists).
        net, net_rv = col.net_since(opts.rv)
    pos = col.rv if state is not None or opts.rv is None else opts.rv
    resp = web.StreamResponse(headers={"Content-Type": "application/json",
                                       "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    if net_rv is not None:
        await _send_changes(resp, net, sel, enc)
        pos = net_rv
        del net
    if state is not None:
        await _send_state(resp, state, sel, enc)
        del state
        if opts.send_initial and bookmarks:
            await resp.write(enc.bookmark(pos, initial_end=True))
    bookmark_at = loop.time() + settings.bookmark_every
    async with lifecycle.track(name) as shutdown:
        while not (shutdown.is_set() or col.closed
                   or (lifecycle.draining.is_set() and not forwarded)):
            now = loop.time()
            if now >= deadline:
                break
            if bookmarks and now >= bookmark_at:
                await resp.write(enc.bookmark(pos))
                bookmark_at = now + settings.bookmark_every
            try:
                events = col.since(pos, CATCH_UP_BATCH)
            except StatusError:
                await resp.write(enc.error(expired(pos)))
                break
            if events:
                await _send_changes(resp, events, sel, enc)
                pos = events[-1].rv
                continue
            wait = min(deadline - now, 1.0)
            if bookmarks:
                wait = min(wait, max(bookmark_at - now, 0.0))
            await col.wait(pos, wait)
        else:
            await _send_rest(resp, col, pos, sel, enc)
    await resp.write_eof()
    return resp


async def _send_rest(resp: web.StreamResponse, col: Collection, pos: int, sel: Selector,
                     enc: Encoder) -> None:
    """A watch ending at its term's close or this replica's drain: the changes it has
    not yet sent, then the end (the client resumes from its last version: the next
    leader's mirror continues this history, or it is 410 there)."""
    try:
        rest = col.final(pos)
    except StatusError:
        await resp.write(enc.error(expired(pos)))
        return
    for i in range(0, len(rest), CATCH_UP_BATCH):
        await _send_changes(resp, rest[i:i + CATCH_UP_BATCH], sel, enc)
