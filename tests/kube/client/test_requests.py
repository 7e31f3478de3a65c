"""aggapi.kube.client's requests against a real HTTPS server on 127.0.0.1: errors carrying
the Status, watch streams, path segments, its connection pools, parsing off the event
loop, and the apiserver's imports."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

import pytest
from aiohttp import web

from aggapi.kube import client as kube
from aggapi.kube.client import KubeClient, KubeError
from tests.kube.client.conftest import BIG, ServeFn


async def test_errors_carry_status_and_message(serve: ServeFn) -> None:
    api = await serve(tls=False)
    async with kube.client_for_url(api.url, token="t") as client:
        with pytest.raises(KubeError) as err:
            await client.get("/api/v1/namespaces/ns/pods/missing")
        assert err.value.status == 404
        assert err.value.reason == "NotFound"
        assert err.value.message == 'pods "missing" not found'
        assert api.last["authorization"] == "Bearer t"
        with pytest.raises(KubeError) as err:
            await client.get("/broken")
        assert err.value.status == 502 and err.value.reason == "Bad Gateway"
        assert "bad gateway" in err.value.message


async def test_watch_reads_events_until_the_stream_ends(serve: ServeFn) -> None:
    api = await serve(tls=False)
    async with KubeClient(api.url) as client:
        listed = await client.get("/api/v1/namespaces/ns/pods", {"fieldSelector": "a=b"})
        rv = listed["metadata"]["resourceVersion"]
        events = [(kind, obj) async for kind, obj in client.watch(
            "/api/v1/namespaces/ns/pods", {"fieldSelector": "a=b"},
            resource_version=rv, timeout_seconds=30)]
    assert [k for k, _ in events] == ["ADDED", "BOOKMARK", "MODIFIED", "ERROR"]
    assert events[2][1]["data"] == BIG
    assert events[3][1]["code"] == 410
    assert api.last["query"] == {"fieldSelector": "a=b", "watch": "true",
                                 "allowWatchBookmarks": "true", "resourceVersion": "5",
                                 "timeoutSeconds": "30"}


async def test_watch_refuses_endless_lines(serve: ServeFn,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    api = await serve(tls=False)
    monkeypatch.setattr(kube, "MAX_WATCH_LINE", 100_000)
    seen: list[str] = []
    async with KubeClient(api.url) as client:
        with pytest.raises(KubeError, match="larger than"):
            async for kind, _obj in client.watch("/api/v1/namespaces/ns/pods"):
                seen.append(kind)
    assert seen == ["ADDED", "BOOKMARK"]


def test_path_segment() -> None:
    assert kube.path_segment("web-0") == "web-0"
    assert kube.path_segment("a/b c") == "a%2Fb%20c"
    for bad in ("", ".", ".."):
        with pytest.raises(ValueError):
            kube.path_segment(bad)


def test_apiserver_does_not_import_kubernetes_asyncio() -> None:
    """~40 MiB of model classes: the apiserver must stay under its memory budget."""
    code = ("import sys, aggapi.apiserver.main, aggapi.apiserver.app\n"
            "print(sorted(m for m in sys.modules if m.startswith('kubernetes')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, timeout=60).stdout
    assert out.strip() == "[]"


async def test_open_watches_do_not_use_up_the_request_pool(unused_tcp_port: int) -> None:
    """More watches open than the request pool allows: a SubjectAccessReview-like call
    still goes through (watches have their own pool)."""
    release = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n')
        await release.wait()
        return resp

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"kind": "SubjectAccessReview", "status": {"allowed": True}})

    app = web.Application()
    app.router.add_get("/watch", hang)
    app.router.add_post("/review", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    gens = []
    try:
        async with KubeClient(f"http://127.0.0.1:{unused_tcp_port}", limit=2) as client:
            for _ in range(3):
                gen = client.watch("/watch")
                assert (await anext(gen))[0] == "ADDED"
                gens.append(gen)
            answer = await asyncio.wait_for(client.post("/review", {}), 5)
            assert answer["status"]["allowed"] is True
            release.set()
            for gen in gens:
                await gen.aclose()
    finally:
        release.set()
        await runner.cleanup()


async def test_a_big_answer_is_parsed_off_the_event_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A list page of 500 pods is a megabyte: tens of ms of parsing that would hold
    every other request and watch of the process."""
    import threading

    from tests.framework.fakekube import FakeKube
    fake = FakeKube()
    for i in range(3):
        fake.put("api/v1", "configmaps", {"metadata": {"name": f"c{i}", "namespace": "ns"},
                                          "data": {"x": "y" * 40_000}})
    await fake.start()
    threads: list[str] = []
    real = kube.loads

    def recording(raw: bytes) -> Any:
        threads.append(threading.current_thread().name)
        return real(raw)
    monkeypatch.setattr(kube, "loads", recording)
    api = fake.kube_client()
    try:
        assert len((await api.get("/api/v1/namespaces/ns/configmaps"))["items"]) == 3
        await api.get("/api/v1/namespaces/ns/configmaps/c0")  # 40 kB: inline
    finally:
        await api.close()
        await fake.stop()
    main = threading.main_thread().name
    assert threads[0] != main and threads[1] == main, threads
