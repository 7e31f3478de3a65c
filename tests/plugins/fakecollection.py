"""A stand-in for kube-apiserver serving ``podimagepulls`` list and watch as the
collections' handler documents them (docs/kep-aggapi.md, "Collections"), plus the
Deployment GET the plugin resolves a workload with.

A fake for fast plugin tests: resourceVersions count the changes, a watch replays the
changes after its version, one older than the kept history is 410 Expired. Tests
script the failures a long watch meets: a connection cut after N events, the history
compacted meanwhile (so the resume is a 410 and the client relists), an ERROR event.
The real collections are exercised by tests/e2e/kubelet/test_plugin_collections_kubelet.py.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

GV = "subresources.aggapi.io/v1alpha1"
Obj = dict[str, Any]


def pod_image_pull(ns: str, name: str, *, node: str = "node-0", phase: str = "Downloading",
                   progress: int | None = 0, total: int | None = 100 << 20,
                   rate: float | None = 1 << 20, eta: float | None = None,
                   reason: str = "", labels: dict[str, str] | None = None,
                   image: str = "registry.local/app:1") -> Obj:
    """A PodImagePull of one image, shaped as collections/podimagepulls.py builds it."""
    present = phase in ("Done", "AlreadyPresent")
    if eta is None and rate and isinstance(total, int) and isinstance(progress, int) \
            and not present:
        eta = round((total - progress) / rate, 1)
    img: Obj = {"container": "app", "image": image, "phase": phase, "progress": progress,
                "total": total, "bytesPerSecond": None if present else rate,
                "etaSeconds": None if present else eta, "attempt": 1,
                "waitingForSlot": phase == "Waiting"}
    if phase == "Waiting":
        img["slots"] = {"used": 1, "limit": 1}
    if reason:
        img["reason"] = reason
    return {"apiVersion": GV, "kind": "PodImagePull",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                         "labels": labels if labels is not None else {"app": "web"}},
            "spec": {"nodeName": node},
            "status": {"phase": phase, "progress": None if present else progress,
                       "total": None if present else total,
                       "bytesPerSecond": img["bytesPerSecond"], "etaSeconds": img["etaSeconds"],
                       "imagesPresent": int(present), "images": [img]}}


def _labels_match(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        k, _, v = term.partition("=")
        if labels.get(k) != v:
            return False
    return True


def _fields_match(selector: str, obj: Obj) -> bool:
    values = {"metadata.name": obj["metadata"]["name"],
              "metadata.namespace": obj["metadata"]["namespace"],
              "spec.nodeName": obj["spec"]["nodeName"]}
    for term in filter(None, selector.split(",")):
        k, _, v = term.partition("=")
        if values.get(k) != v:
            return False
    return True


@dataclass
class FakeCollection:
    objects: dict[tuple[str, str], Obj] = field(default_factory=dict)
    history: list[tuple[int, str, Obj]] = field(default_factory=list)
    rv: int = 1
    oldest: int = 1  # a watch from a version before this is 410 Expired
    deployments: dict[tuple[str, str], Obj] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    cut_watch_after: int | None = None  # the next watch is cut after N events
    compact_on_cut: bool = False  # ... and the history is dropped meanwhile
    error_event_next_watch: bool = False  # the next watch sends ERROR 410 first
    # The next requests to the collection, one failure each (a replica going away
    # behind the aggregator): an HTTP code answered as a Status ("504" is kube's
    # "Too large resource version"), "reset" (the connection closed, no answer) or
    # "empty" (a watch that ends at once with no event).
    failures: list[str] = field(default_factory=list)
    retry_after: int = 1  # the failures' Status details.retryAfterSeconds
    port: int = 0

    def __post_init__(self) -> None:
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None

    # --- the scripted cluster ---------------------------------------------------------
    def put(self, obj: Obj) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        typ = "MODIFIED" if key in self.objects else "ADDED"
        self._record(typ, key, obj)

    def delete(self, ns: str, name: str) -> None:
        self._record("DELETED", (ns, name), self.objects[(ns, name)])

    def _record(self, typ: str, key: tuple[str, str], obj: Obj) -> None:
        self.rv += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.rv)
        if typ == "DELETED":
            del self.objects[key]
        else:
            self.objects[key] = obj
        self.history.append((self.rv, typ, obj))
        self._changed.set()
        self._changed = asyncio.Event()

    def compact(self) -> None:
        self.history.clear()
        self.oldest = self.rv + 1

    def kubeconfig(self, d: Path, namespace: str = "ns") -> Path:
        path = d / "kubeconfig"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "u",
                                                      "namespace": namespace}}]}))
        return path

    def verbs(self) -> list[str]:
        """"list"/"watch" per request to the collection, in order."""
        return ["watch" if q.get("watch") else "list" for _, p, q in self.requests
                if p.endswith("/podimagepulls")]

    # --- serving ----------------------------------------------------------------------
    async def start(self) -> None:
        app = web.Application()
        app.router.add_get(f"/apis/{GV}/namespaces/{{ns}}/podimagepulls", self.collection)
        app.router.add_get(f"/apis/{GV}/podimagepulls", self.collection)
        app.router.add_get("/apis/apps/v1/namespaces/{ns}/deployments/{name}", self.deployment)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def deployment(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path, dict(request.query)))
        obj = self.deployments.get((request.match_info["ns"], request.match_info["name"]))
        if obj is None:
            return web.json_response({"kind": "Status", "code": 404, "reason": "NotFound",
                                      "message": "deployment not found"}, status=404)
        return web.json_response(obj)

    def _selected(self, request: web.Request, obj: Obj) -> bool:
        ns = request.match_info.get("ns")
        q = request.query
        return (ns is None or obj["metadata"]["namespace"] == ns) \
            and _labels_match(q.get("labelSelector", ""), obj["metadata"]["labels"]) \
            and _fields_match(q.get("fieldSelector", ""), obj)

    async def _fail(self, request: web.Request, how: str) -> web.StreamResponse:
        if how == "reset":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if how == "empty":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            return resp
        code = int(how)
        body: Obj = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
                     "reason": {503: "ServiceUnavailable", 504: "Timeout"}.get(code, ""),
                     "message": "Too large resource version" if code == 504 else "no endpoints",
                     "details": {"retryAfterSeconds": self.retry_after}}
        if code == 504:
            body["details"]["causes"] = [{"reason": "ResourceVersionTooLarge",
                                          "message": "Too large resource version"}]
        return web.json_response(body, status=code)

    async def collection(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(("GET", request.path, dict(request.query)))
        if self.failures:
            return await self._fail(request, self.failures.pop(0))
        if request.query.get("watch") not in ("1", "true"):
            items = [o for o in self.objects.values() if self._selected(request, o)]
            body = json.dumps({"apiVersion": GV, "kind": "PodImagePullList",
                               "metadata": {"resourceVersion": str(self.rv)},
                               "items": items})
            return web.Response(text=body, content_type="application/json")
        pos = int(request.query.get("resourceVersion") or self.rv)
        if pos + 1 < self.oldest:
            return web.json_response({"kind": "Status", "apiVersion": "v1", "code": 410,
                                      "reason": "Expired", "status": "Failure",
                                      "message": f"too old resource version: {pos}"},
                                     status=410)
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if self.error_event_next_watch:
            self.error_event_next_watch = False
            await resp.write(json.dumps({"type": "ERROR", "object": {
                "kind": "Status", "code": 410, "reason": "Expired",
                "message": "too old resource version"}}).encode() + b"\n")
            return resp
        cut, self.cut_watch_after = self.cut_watch_after, None
        sent = 0
        while True:
            changed = self._changed
            batch = [(rv, t, o) for rv, t, o in self.history if rv > pos]
            out: list[bytes] = []
            for rv, typ, obj in batch:
                pos = rv
                if not self._selected(request, obj):
                    continue
                if cut is not None and sent >= cut:
                    if self.compact_on_cut:
                        self.compact()
                    await resp.write(b"".join(out))
                    assert request.transport is not None
                    request.transport.close()  # a dropped connection, mid-stream
                    return resp
                out.append(json.dumps({"type": typ, "object": obj}).encode() + b"\n")
                sent += 1
            if out:
                await resp.write(b"".join(out))
            try:
                await asyncio.wait_for(changed.wait(), 5.0)
            except TimeoutError:
                return resp  # as timeoutSeconds: the client resumes from its version
