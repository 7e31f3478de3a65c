"""The Informer over aggapi.kube.client: list, watch, relist on 410 Gone, bookmarks, retries."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from aggapi.kube.client import KubeClient
from aggapi.kube.informer import Informer
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

PODS = "/api/v1/namespaces/ns1/pods"


def _pod(name: str, app: str = "web", ns: str = "ns1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {"app": app}}}


@pytest.fixture(params=[1000])
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeKube]:
    kube = FakeKube(history=request.param)
    await kube.start()
    yield kube
    await kube.stop()


@pytest.fixture
async def informers() -> AsyncIterator[list[Informer]]:
    started: list[Informer] = []
    yield started
    for inf in started:
        await inf.stop()


async def test_list_then_watch(fake: FakeKube, informers: list[Informer]) -> None:
    fake.put("api/v1", "pods", _pod("web-0"))
    fake.put("api/v1", "pods", _pod("db-0", app="db"))
    fake.put("api/v1", "pods", _pod("web-9", ns="ns2"))
    async with fake.kube_client() as api:
        inf = Informer(api, PODS, {"labelSelector": "app=web"})
        informers.append(inf)
        seen: list[tuple[str, str]] = []
        inf.add_listener(lambda kind, obj: seen.append(
            (kind, (obj.get("metadata") or {}).get("name", ""))))
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert set(inf.items) == {"ns1/web-0"}
        fake.put("api/v1", "pods", _pod("web-1"))
        fake.put("api/v1", "pods", _pod("db-1", app="db"))  # filtered by the selector
        fake.put("api/v1", "pods", {**_pod("web-0"), "spec": {"nodeName": "n1"}})
        fake.delete("api/v1", "pods", "ns1", "web-1")
        await until(lambda: len(seen) == 4)
        assert seen == [("RELIST", ""), ("ADDED", "web-1"), ("MODIFIED", "web-0"),
                        ("DELETED", "web-1")]
        assert set(inf.items) == {"ns1/web-0"}
        assert inf.items["ns1/web-0"]["spec"] == {"nodeName": "n1"}
        await inf.stop()


@pytest.mark.parametrize("fake", [2], indirect=True)  # a short history: 410 soon
async def test_relists_after_410_error_event(fake: FakeKube, informers: list[Informer]) -> None:
    fake.put("api/v1", "pods", _pod("web-0"))
    async with fake.kube_client() as api:
        inf = Informer(api, PODS)
        informers.append(inf)
        kinds: list[str] = []
        inf.add_listener(lambda kind, _obj: kinds.append(kind))
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 5)
        await until(lambda: any("watch=true" in p for _m, p in fake.requests))
        # The watch ends and, before it resumes, more changes than the fake keeps
        # in history: resuming from our resourceVersion is answered with 410.
        fake.close_watches()
        for i in range(1, 5):
            fake.put("api/v1", "pods", _pod(f"web-{i}"))
        await until(lambda: len(inf.items) == 5)
        assert kinds == ["RELIST", "RELIST"]
        lists = [p for m, p in fake.requests if m == "GET" and "watch=" not in p]
        assert len(lists) == 2
        await inf.stop()


class _Scripted:
    """A stub API whose list and watch answers follow a script, to check the
    resourceVersions the informer resumes from."""

    def __init__(self) -> None:
        self.lists = 0
        self.watch_rvs: list[str] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") != "true":
            self.lists += 1
            if self.lists == 1:  # an outage: retried with backoff
                return web.json_response({"kind": "Status", "code": 500,
                                          "message": "etcd down"}, status=500)
            rv = {2: "10", 3: "30"}[self.lists]
            return web.json_response({"metadata": {"resourceVersion": rv}, "items": [
                {"metadata": {"name": f"p{self.lists}", "namespace": "ns1",
                              "resourceVersion": rv}}]})
        rv = request.query["resourceVersion"]
        self.watch_rvs.append(rv)
        if rv == "20":  # expired while we were away
            return web.json_response({"kind": "Status", "code": 410, "reason": "Expired",
                                      "message": "too old resource version"}, status=410)
        resp = web.StreamResponse()
        await resp.prepare(request)
        if rv == "10":
            await resp.write(json.dumps({"type": "BOOKMARK", "object": {
                "metadata": {"resourceVersion": "20"}}}).encode() + b"\n")
            return resp  # stream ends: resume from the bookmark's version
        await asyncio.sleep(30)
        return resp


async def test_bookmarks_http_410_and_outages(informers: list[Informer]) -> None:
    stub = _Scripted()
    app = web.Application()
    app.router.add_get(PODS, stub.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with KubeClient(f"http://127.0.0.1:{port}") as api:
            inf = Informer(api, PODS, max_backoff=0.5)
            informers.append(inf)
            inf.start()
            await until(lambda: stub.watch_rvs[-1:] == ["30"], within=10)
            assert stub.watch_rvs == ["10", "20", "30"]
            assert stub.lists == 3
            assert set(inf.items) == {"ns1/p3"}  # the relist replaced the cache
            await inf.stop()
    finally:
        await runner.cleanup()


async def test_lists_in_pages(fake: FakeKube, informers: list[Informer]) -> None:
    """1,201 pods arrive in three pages of at most 500 (as client-go's reflector lists),
    every one of them kept."""
    for i in range(1201):
        fake.put("api/v1", "pods", _pod(f"p{i:04d}"))
    async with fake.kube_client() as api:
        inf = Informer(api, PODS)
        informers.append(inf)
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 10)
        assert len(inf.items) == 1201
        lists = [q for m, q in fake.requests if m == "GET" and "watch" not in q]
        assert len(lists) == 3 and all("limit=500" in q for q in lists), lists
        assert "continue=1000" in lists[-1]


async def test_transform_keeps_what_it_returns(fake: FakeKube,
                                               informers: list[Informer]) -> None:
    """The cache holds what the transform returns; an object it drops is not kept, and
    one that stops being kept leaves as a deletion."""
    def only_web(obj: dict[str, Any]) -> dict[str, Any] | None:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return {**obj, "slim": True} if labels.get("app") == "web" else None

    fake.put("api/v1", "pods", _pod("web-0"))
    fake.put("api/v1", "pods", _pod("db-0", app="db"))
    async with fake.kube_client() as api:
        inf = Informer(api, PODS, transform=only_web)
        informers.append(inf)
        seen: list[tuple[str, str]] = []
        inf.add_listener(lambda kind, obj: seen.append(
            (kind, (obj.get("metadata") or {}).get("name", ""))))
        inf.start()
        await asyncio.wait_for(inf.synced.wait(), 5)
        assert set(inf.items) == {"ns1/web-0"} and inf.items["ns1/web-0"]["slim"] is True
        fake.put("api/v1", "pods", _pod("db-1", app="db"))
        fake.put("api/v1", "pods", _pod("web-1"))
        fake.put("api/v1", "pods", _pod("web-0", app="db"))  # no longer kept
        await until(lambda: len(seen) == 3)
        assert seen == [("RELIST", ""), ("ADDED", "web-1"), ("DELETED", "web-0")]
        assert set(inf.items) == {"ns1/web-1"} and inf.items["ns1/web-1"]["slim"] is True


async def test_a_big_list_page_is_decoded_without_gc_collections(
        fake: FakeKube, informers: list[Informer]) -> None:
    """A page of hundreds of pods is decoded with the cyclic GC paused: no collection
    starts inside the decode (in bench_scale's cold 10,000-pod list they took half of
    aggapi's CPU)."""
    for i in range(500):
        fake.put("api/v1", "pods", {**_pod(f"web-{i}"), "status": {
            "conditions": [{"type": t, "status": "True"} for t in ("Ready", "Initialized")]}})
    started: list[int] = []
    in_decode = False
    decode = json.JSONDecoder.decode

    def traced(self: json.JSONDecoder, s: str, *args: Any) -> Any:
        nonlocal in_decode
        in_decode = True
        try:
            return decode(self, s, *args)
        finally:
            in_decode = False

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and in_decode:
            started.append(info["generation"])
    gc.callbacks.append(on_gc)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(json.JSONDecoder, "decode", traced)
            async with fake.kube_client() as api:
                page = await api.get(PODS, {"limit": "500"})
    finally:
        gc.callbacks.remove(on_gc)
    assert len(page["items"]) == 500
    assert started == []
