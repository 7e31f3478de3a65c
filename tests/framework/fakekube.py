"""An in-process fake kube-apiserver for tests (plain HTTP on 127.0.0.1).

A small in-memory object store with GET, LIST (label/field selectors) and WATCH
for any resource path (``/api/v1/...`` or ``/apis/G/V/...``, namespaced or not),
plus SubjectAccessReview and TokenReview answered by scripted decisions. Every
call is recorded so tests can count them.

    kube = FakeKube()
    url = await kube.start()
    kube.put("api/v1", "configmaps", {...})
    kube.sar_policy = lambda spec: spec["user"] == "alice"
    api = kube.kube_client()       # aggapi.kube.client.KubeClient, the product's own client

tests/framework_tests/test_fakekube.py checks it against that client.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import inspect
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from aggapi.kube.client import KubeClient, client_for_url

Obj = dict[str, Any]
# A SAR policy gets the review's spec; returns allowed, (allowed, reason) or a
# full status dict; may be async; an exception makes the review fail with 500.
SarPolicy = Callable[[Obj], "bool | tuple[bool, str] | Obj | Awaitable[Any]"]

SAR_PATH = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
TOKENREVIEW_PATH = "/apis/authentication.k8s.io/v1/tokenreviews"


@dataclass(eq=False)  # hashed by identity: kept in a set
class _Watcher:
    api: str
    resource: str
    namespace: str
    queue: asyncio.Queue[tuple[str, Obj]] = field(default_factory=asyncio.Queue)


def _status(code: int, message: str, reason: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                              "status": "Failure", "message": message, "reason": reason,
                              "code": code}, status=code)


def _lookup(obj: Obj, dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _selector_terms(raw: str) -> list[tuple[str, str, bool]]:
    terms = []
    for term in filter(None, (t.strip() for t in raw.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            terms.append((k.strip(), v.strip(), False))
        else:
            k, v = term.replace("==", "=").split("=", 1)
            terms.append((k.strip(), v.strip(), True))
    return terms


def _matches(obj: Obj, field_sel: str, label_sel: str) -> bool:
    for key, value, eq in _selector_terms(field_sel):
        if (str(_lookup(obj, key) or "") == value) != eq:
            return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for key, value, eq in _selector_terms(label_sel):
        if (labels.get(key) == value) != eq:
            return False
    return True


class FakeKube:
    def __init__(self, *, history: int = 1000) -> None:
        # (api, resource) -> {(namespace, name): object}; api is "api/v1" or "apis/G/V".
        self.objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.rv = 100
        self._history: list[tuple[int, str, str, str, Obj]] = []
        self._history_max = history
        self._watchers: set[_Watcher] = set()
        self.requests: list[tuple[str, str]] = []
        self.sar_calls: list[Obj] = []
        self.token_calls: list[str] = []
        self.sar_policy: SarPolicy = lambda _spec: False
        self.sar_error: int | None = None  # answer SARs with this HTTP error
        self.tokens: dict[str, Obj] = {}   # token -> user {username, uid, groups, extra}
        self.tokenreview_error: int | None = None
        # Resources ("configmaps") that POST (create) and PUT (replace) may write; the
        # rest are read-only.
        self.writable: set[str] = set()
        self._runner: web.AppRunner | None = None
        self.url = ""

    # --- store -------------------------------------------------------------
    def put(self, api: str, resource: str, obj: Obj) -> Obj:
        """Create or replace; returns the stored copy (resourceVersion set)."""
        event, obj = self._store(api.strip("/"), resource, obj)
        self._notify(api.strip("/"), resource, event, obj)
        return copy.deepcopy(obj)

    def _store(self, api: str, resource: str, obj: Obj) -> tuple[str, Obj]:
        """A copy of ``obj`` stored with the next resourceVersion (and a uid and
        creation time if it has none); the change's type, and the stored object."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        key = (meta.get("namespace", ""), meta["name"])
        bucket = self.objects.setdefault((api, resource), {})
        event = "MODIFIED" if key in bucket else "ADDED"
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp",
                        dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        bucket[key] = obj
        return event, obj

    def delete(self, api: str, resource: str, namespace: str, name: str) -> None:
        bucket = self.objects.get((api.strip("/"), resource), {})
        obj = bucket.pop((namespace, name), None)
        if obj is not None:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self._notify(api.strip("/"), resource, "DELETED", obj)

    def get(self, api: str, resource: str, namespace: str, name: str) -> Obj | None:
        obj = self.objects.get((api.strip("/"), resource), {}).get((namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def _notify(self, api: str, resource: str, event: str, obj: Obj) -> None:
        ns = obj["metadata"].get("namespace", "")
        self._history.append((self.rv, api, resource, event, copy.deepcopy(obj)))
        del self._history[:-self._history_max]
        for w in self._watchers:
            if w.api == api and w.resource == resource and w.namespace in ("", ns):
                w.queue.put_nowait((event, copy.deepcopy(obj)))

    def watching(self, resource: str) -> int:
        """Watches open now on ``resource`` (pods, events, ...), any namespace."""
        return sum(1 for w in self._watchers if w.resource == resource)

    def close_watches(self) -> None:
        """End every open watch (as an apiserver restart or timeout would)."""
        for w in self._watchers:
            w.queue.put_nowait(("__END__", {}))

    # --- HTTP --------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post(SAR_PATH, self._sar)
        app.router.add_post(TOKENREVIEW_PATH, self._tokenreview)
        app.router.add_route("*", "/{tail:.*}", self._resource)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sock = site._server.sockets[0]  # type: ignore[union-attr]
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    async def stop(self) -> None:
        self.close_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def kube_client(self) -> KubeClient:
        return client_for_url(self.url)

    async def _sar(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path))
        body = await request.json()
        self.sar_calls.append(body)
        if self.sar_error is not None:
            return _status(self.sar_error, "authorization webhook unavailable",
                           "ServiceUnavailable")
        try:
            result = self.sar_policy(body.get("spec", {}))
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # a scripted failure
            return _status(500, f"policy error: {exc}", "InternalError")
        if isinstance(result, dict):
            status = result
        elif isinstance(result, tuple):
            status = {"allowed": bool(result[0]), "reason": result[1]}
        else:
            status = {"allowed": bool(result)}
        return web.json_response({**body, "status": status}, status=201)

    async def _tokenreview(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path))
        body = await request.json()
        token = body.get("spec", {}).get("token", "")
        self.token_calls.append(token)
        if self.tokenreview_error is not None:
            return _status(self.tokenreview_error, "token webhook unavailable",
                           "ServiceUnavailable")
        user = self.tokens.get(token)
        status: Obj = {"authenticated": user is not None}
        if user is not None:
            status["user"] = user
        else:
            status["error"] = "invalid token"
        return web.json_response({**body, "status": status}, status=201)

    @staticmethod
    def _parse(path: str) -> tuple[str, str, str, str] | None:
        """(api, namespace, resource, name) of a resource path."""
        parts = [p for p in path.split("/") if p]
        if parts[:2] == ["api", "v1"]:
            api, rest = "api/v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            api, rest = "/".join(parts[:3]), parts[3:]
        else:
            return None
        ns = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest or len(rest) > 2:
            return None
        return api, ns, rest[0], rest[1] if len(rest) == 2 else ""

    async def _resource(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs))
        parsed = self._parse(request.path)
        if parsed is None:
            return _status(404, "the server could not find the requested resource", "NotFound")
        api, ns, resource, name = parsed
        if request.method in ("POST", "PUT") and resource in self.writable:
            return await self._write(request, api, ns, resource, name)
        if request.method != "GET":
            return _status(405, "fake apiserver: read-only resources", "MethodNotAllowed")
        if name:
            obj = self.get(api, resource, ns, name)
            if obj is None:
                return _status(404, f'{resource} "{name}" not found', "NotFound")
            return web.json_response(obj)
        fsel = request.query.get("fieldSelector", "")
        lsel = request.query.get("labelSelector", "")
        if request.query.get("watch", "").lower() in ("1", "true"):
            return await self._watch(request, api, ns, resource, fsel, lsel)
        items = [copy.deepcopy(o) for (ons, _), o in
                 sorted(self.objects.get((api, resource), {}).items())
                 if ns in ("", ons) and _matches(o, fsel, lsel)]
        meta: Obj = {"resourceVersion": str(self.rv)}
        # limit/continue as kube-apiserver pages a list (the token here: an offset).
        limit = int(request.query.get("limit") or 0)
        if limit > 0:
            start = int(request.query.get("continue") or 0)
            items, rest = items[start:start + limit], len(items) - start - limit
            if rest > 0:
                meta.update({"continue": str(start + limit), "remainingItemCount": rest})
        return web.json_response({"kind": "List", "apiVersion": "v1", "metadata": meta,
                                  "items": items})

    async def _write(self, request: web.Request, api: str, ns: str, resource: str,
                     name: str) -> web.Response:
        """POST to the collection creates (409 if it exists); PUT to the object replaces
        it (409 if its resourceVersion is not the stored one), as kube-apiserver."""
        obj = await request.json()
        meta = obj.setdefault("metadata", {})
        meta["namespace"] = ns
        current = self.get(api, resource, ns, meta.get("name", ""))
        if request.method == "POST" and not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        if request.method == "POST":
            if name or not meta.get("name"):
                return _status(405, "create on the collection, with a name", "MethodNotAllowed")
            if current is not None:
                return _status(409, f'{resource} "{meta["name"]}" already exists',
                               "AlreadyExists")
            return web.json_response(self.put(api, resource, obj), status=201)
        if meta.get("name") != name:
            return _status(400, "the name in the body is not the path's", "BadRequest")
        if current is None:
            return _status(404, f'{resource} "{name}" not found', "NotFound")
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return _status(409, "the object has been modified", "Conflict")
        meta["uid"] = current["metadata"]["uid"]
        return web.json_response(self.put(api, resource, obj))

    @staticmethod
    async def _watch_response(request: web.Request) -> tuple[web.StreamResponse, float | None]:
        """A watch's response, started, and its timeoutSeconds (None: none)."""
        timeout = float(request.query.get("timeoutSeconds", "0") or 0) or None
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        return resp, timeout

    async def _watch(self, request: web.Request, api: str, ns: str, resource: str,
                     fsel: str, lsel: str) -> web.StreamResponse:
        watcher = _Watcher(api, resource, ns)
        rv_raw = request.query.get("resourceVersion", "")
        if rv_raw and rv_raw != "0":
            rv = int(rv_raw)
            oldest = self._history[0][0] if self._history else self.rv + 1
            if rv < oldest - 1 and rv < self.rv:
                backlog: list[tuple[str, Obj]] = [("ERROR", {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "too old resource version", "reason": "Expired", "code": 410})]
            else:
                backlog = [(ev, copy.deepcopy(o)) for r, a, res, ev, o in self._history
                           if r > rv and a == api and res == resource
                           and ns in ("", o["metadata"].get("namespace", ""))]
        else:
            backlog = [("ADDED", copy.deepcopy(o)) for (ons, _), o in
                       sorted(self.objects.get((api, resource), {}).items()) if ns in ("", ons)]
        for item in backlog:
            watcher.queue.put_nowait(item)
        resp, timeout = await self._watch_response(request)
        self._watchers.add(watcher)
        try:
            async with asyncio.timeout(timeout):
                while True:
                    try:
                        # (woken now and then to notice a client that went away, so
                        # watching() counts only watches really held)
                        event, obj = await asyncio.wait_for(watcher.queue.get(), 0.05)
                    except TimeoutError:
                        if request.transport is None or request.transport.is_closing():
                            break
                        continue
                    if event == "__END__":
                        break
                    if event != "ERROR" and not _matches(obj, fsel, lsel):
                        continue
                    await resp.write(json.dumps({"type": event, "object": obj}).encode() + b"\n")
                    if event == "ERROR":
                        break
        except (TimeoutError, ConnectionResetError):
            pass
        finally:
            self._watchers.discard(watcher)
        return resp
