"""The replay world's fake kube-apiserver: ``tests.framework.fakekube.FakeKube`` with
what kube-apiserver's watch cache does at 50,000 pods, so that the fake's own cost does
not stand in for the replicas' (it shares the machine's two cores with them).

- Each change is encoded once, when it is written, and that one line goes to every
  watch (kube-apiserver serializes a cached object once per encoding for all watchers);
  the base fake deep-copies and encodes per watcher, and wakes each watch every 50 ms.
- Lists page in key order from a sorted index (continue: the first page's version and
  the last key), joining the objects' stored encodings: 50,000 pods in pages of 500
  without sorting, copying or encoding all of them per page.
- A watch from a version finds its place in the history by bisection.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from aiohttp import web

from tests.framework.fakekube import FakeKube, Obj, _matches

Key = tuple[str, str]  # (namespace, name)
# rv, api, resource, namespace, the object, its watch event's line
Change = tuple[int, str, str, str, Obj, bytes]
END = b""


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Stream:
    api: str
    resource: str
    namespace: str
    fsel: str
    lsel: str
    lines: list[bytes] = field(default_factory=list)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def wants(self, api: str, resource: str, ns: str, obj: Obj) -> bool:
        return (api == self.api and resource == self.resource
                and self.namespace in ("", ns)
                and (not (self.fsel or self.lsel) or _matches(obj, self.fsel, self.lsel)))

    def send(self, line: bytes) -> None:
        self.lines.append(line)
        self.wake.set()


def _compact(obj: Obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _line(event: str, body: bytes) -> bytes:
    return b'{"type":"%s","object":%s}\n' % (event.encode(), body)


class ReplayKube(FakeKube):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._keys: dict[tuple[str, str], list[Key]] = {}
        self._bodies: dict[tuple[str, str], dict[Key, bytes]] = {}
        self._changes: list[Change] = []
        self._streams: set[_Stream] = set()

    # --- store ---------------------------------------------------------------
    def put(self, api: str, resource: str, obj: Obj) -> Obj:
        """Create or replace; returns the stored object, never to be changed (the
        caller's is copied once: later writes replace it whole)."""
        api = api.strip("/")
        event, obj = self._store(api, resource, obj)
        key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
        if event == "ADDED" and (keys := self._keys.get((api, resource))) is not None:
            bisect.insort(keys, key)
        body = _compact(obj)
        self._bodies.setdefault((api, resource), {})[key] = body
        self._record(api, resource, event, obj, body)
        return obj

    def delete(self, api: str, resource: str, namespace: str, name: str) -> None:
        api = api.strip("/")
        obj = self.objects.get((api, resource), {}).pop((namespace, name), None)
        if obj is None:
            return
        self._keys.pop((api, resource), None)
        self._bodies.get((api, resource), {}).pop((namespace, name), None)
        self.rv += 1
        obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.rv)}}
        self._record(api, resource, "DELETED", obj,
                     _compact(obj))

    def _record(self, api: str, resource: str, event: str, obj: Obj, body: bytes) -> None:
        ns = obj["metadata"].get("namespace", "")
        line = _line(event, body)
        self._changes.append((self.rv, api, resource, ns, obj, line))
        if len(self._changes) > self._history_max * 9 // 8:  # trimmed now and then
            del self._changes[:-self._history_max]
        for s in self._streams:
            if s.wants(api, resource, ns, obj):
                s.send(line)

    def forget_history(self) -> None:
        """Watches start from the lists from here on (the world's objects as made)."""
        self._changes.clear()

    def watching(self, resource: str) -> int:
        return sum(1 for s in self._streams if s.resource == resource)

    def close_watches(self) -> None:
        for s in self._streams:
            s.send(END)

    # --- HTTP ------------------------------------------------------------------
    async def _resource(self, request: web.Request) -> web.StreamResponse:
        parsed = self._parse(request.path)
        if request.method != "GET" or parsed is None or parsed[3]:
            return await super()._resource(request)
        self.requests.append((request.method, request.path_qs))
        api, ns, resource, _ = parsed
        fsel = request.query.get("fieldSelector", "")
        lsel = request.query.get("labelSelector", "")
        if request.query.get("watch", "").lower() in ("1", "true"):
            return await self._watch(request, api, ns, resource, fsel, lsel)
        bucket = self.objects.get((api, resource), {})
        bodies = self._bodies.get((api, resource), {})
        keys = self._keys.get((api, resource))
        if keys is None:
            keys = self._keys[(api, resource)] = sorted(bucket)
        limit = int(request.query.get("limit") or 0) or len(keys) + 1
        cont = request.query.get("continue") or ""
        # The token carries the first page's version: every page names it, as kube's
        # pages all come from one snapshot, so a watch from it brings each change made
        # while the pages were read (the newest version lost those to read pages).
        snapshot, *after = json.loads(cont) if cont else (self.rv,)
        start = bisect.bisect_right(keys, tuple(after)) if cont else 0
        if ns:
            start = max(start, bisect.bisect_left(keys, (ns, "")))
        items: list[bytes] = []
        last: Key | None = None
        i = start
        while i < len(keys) and len(items) < limit:
            key = keys[i]
            i += 1
            if ns and key[0] != ns:
                break
            obj = bucket.get(key)
            if obj is not None and (not (fsel or lsel) or _matches(obj, fsel, lsel)):
                items.append(bodies[key])
                last = key
        meta: Obj = {"resourceVersion": str(snapshot)}
        if len(items) == limit and i < len(keys) and (not ns or keys[i][0] == ns):
            meta["continue"] = json.dumps([snapshot, *(last or keys[i - 1])])
        body = b'{"kind":"List","apiVersion":"v1","metadata":%s,"items":[%s]}' % (
            json.dumps(meta).encode(), b",".join(items))
        return web.Response(body=body, content_type="application/json")

    def _backlog(self, api: str, ns: str, resource: str, fsel: str, lsel: str,
                 rv_raw: str) -> list[bytes]:
        """What a new watch sends first: the changes after its version, or (none
        given) every object as ADDED; a version older than the history: one 410."""
        probe = _Stream(api, resource, ns, fsel, lsel)
        if not rv_raw or rv_raw == "0":
            bucket = self.objects.get((api, resource), {})
            bodies = self._bodies.get((api, resource), {})
            return [_line("ADDED", bodies[k]) for k in sorted(bucket)
                    if probe.wants(api, resource, k[0], bucket[k])]
        rv = int(rv_raw)
        oldest = self._changes[0][0] if self._changes else self.rv + 1
        if rv < oldest - 1 and rv < self.rv:
            return [_line("ERROR", json.dumps({
                "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": "too old resource version", "reason": "Expired",
                "code": 410}).encode()), END]
        start = bisect.bisect_right(self._changes, rv, key=itemgetter(0))
        return [c[5] for c in self._changes[start:] if probe.wants(c[1], c[2], c[3], c[4])]

    async def _watch(self, request: web.Request, api: str, ns: str, resource: str,
                     fsel: str, lsel: str) -> web.StreamResponse:
        stream = _Stream(api, resource, ns, fsel, lsel)
        stream.lines = self._backlog(api, ns, resource, fsel, lsel,
                                     request.query.get("resourceVersion", ""))
        resp, timeout = await self._watch_response(request)
        self._streams.add(stream)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    if not stream.lines:
                        stream.wake.clear()
                        try:  # woken now and then to notice a client gone
                            await asyncio.wait_for(stream.wake.wait(), 1.0)
                        except TimeoutError:
                            if request.transport is None or request.transport.is_closing():
                                break
                        continue
                    lines, stream.lines = stream.lines, []
                    ended = END in lines
                    if ended:
                        lines = lines[:lines.index(END)]
                    if lines:
                        await resp.write(b"".join(lines))
                    if ended:
                        break
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self._streams.discard(stream)
        return resp
