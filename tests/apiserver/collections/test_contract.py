"""The list/watch contract as kube-apiserver keeps it (issue 36): list options
validated as it validates them, sendInitialEvents, bookmarks, timeoutSeconds, a named
watch authorized as a watch, and one field-selector parse for authorization and
filtering."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from ..conftest import GV
from .conftest import Env
from .fakes import pod

ALICE = {"Authorization": "Bearer alice-token"}


async def _watch(env: Env, path: str, n: int, *, then: Any = None,
                 within: float = 10.0) -> tuple[list[dict[str, Any]], bool]:
    """The first ``n`` events (after the first, ``then()`` runs once), and whether
    the server ended the stream before them."""
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as s, s.get(env.proxy.url + GV + path,
                                                   headers=ALICE) as resp:
        assert resp.status == 200, await resp.text()
        async with asyncio.timeout(within):
            async for line in resp.content:
                if not line.strip():
                    continue
                out.append(json.loads(line))
                if len(out) == 1 and then is not None:
                    then()
                if len(out) == n:
                    return out, False
    return out, True


def _sars(env: Env) -> list[tuple[str, str]]:
    return [(c["spec"]["resourceAttributes"]["verb"], c["spec"]["resourceAttributes"]["name"])
            for c in env.kube.sar_calls]


@pytest.fixture
def quick_bookmarks(env: Env) -> Iterator[None]:
    """Bookmarks every 50 ms (kube-apiserver's, and the default, are a minute)."""
    from aggapi.apiserver.collections.handler import CollectionHandler
    try:
        from aggapi.apiserver.collections.watch import BOOKMARK_EVERY, WatchSettings
    except ImportError:  # before issue 36: a constant, 15 s, not a parameter
        yield
        return
    assert BOOKMARK_EVERY == 60.0
    from aggapi.apiserver.replicas import LeaderRouted
    for r in env.server.app.router.routes():
        h = getattr(r.handler, "__self__", None)  # a handler object's bound __call__
        h = h.local if isinstance(h, LeaderRouted) else h
        if isinstance(h, CollectionHandler):
            h.settings = WatchSettings(bookmark_every=0.05)
    yield


async def test_a_selector_is_authorized_for_what_it_matches(env: Env) -> None:
    for name in ("a", "b"):
        env.kube.put("api/v1", "pods", pod(name))
    env.kube.sar_calls.clear()
    # Split on every comma, this was authorized for name a; the selector parser kept
    # the commas inside the parentheses and matched every pod. Now one parse: the
    # terms are namespace!="(", name=a and a=")", and "a" is no field.
    code, body = await env.get("/namespaces/ns1/podimagepulls?fieldSelector="
                               "metadata.namespace!%3D(,metadata.name%3Da,a%3D)")
    assert code == 400 and "field label not supported: a" in body["message"], body
    code, body = await env.get("/namespaces/ns1/podimagepulls?fieldSelector="
                               "metadata.namespace!%3D(,metadata.name%3Da,"
                               "metadata.namespace!%3D)")
    assert code == 200 and [i["metadata"]["name"] for i in body["items"]] == ["a"], body
    assert _sars(env)[-1] == ("list", "a")
    # malformed in kube's grammar: 400 before any review
    env.kube.sar_calls.clear()
    code, body = await env.get("/namespaces/ns1/podimagepulls?fieldSelector="
                               "metadata.name%3Da%3Db")
    assert code == 400 and body["reason"] == "BadRequest" and not env.kube.sar_calls


async def test_a_named_watch_is_authorized_as_a_watch(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    env.kube.sar_calls.clear()
    events, _ = await _watch(env, "/namespaces/ns1/podimagepulls/a?watch=1", 1)
    assert events[0]["type"] == "ADDED" and _sars(env) == [("watch", "a")]
    code, body = await env.get("/namespaces/ns1/podimagepulls/a?watch=1&fieldSelector="
                               "metadata.name%3Db")
    assert code == 400 and "doesn't match requested name" in body["message"]


@pytest.mark.parametrize(("query", "code", "message"), [
    ("resourceVersionMatch=NotOlderThan", 422,
     "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
     "resourceVersion is provided"),
    ("resourceVersion=0&resourceVersionMatch=Exact", 422,
     'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for '
     'resourceVersion "0"'),
    ("resourceVersion=5&resourceVersionMatch=Newest", 422,
     'resourceVersionMatch: Unsupported value: "Newest": supported values: "Exact", '
     '"NotOlderThan", ""'),
    ("sendInitialEvents=true", 422,
     "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list"),
    ("watch=1&resourceVersion=5&resourceVersionMatch=NotOlderThan", 422,
     "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch "
     "unless sendInitialEvents is provided"),
    ("watch=1&sendInitialEvents=true", 422,
     "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
     "resourceVersionMatch to NotOlderThan"),
    ("watch=1&sendInitialEvents=true&resourceVersionMatch=Exact", 422,
     '[resourceVersionMatch: Forbidden: sendInitialEvents requires setting '
     'resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: '
     '"Exact": supported values: "NotOlderThan"]'),
    ("watch=1&timeoutSeconds=1.5", 400, "timeoutSeconds"),
    ("watch=1&timeoutSeconds=%201", 400, "timeoutSeconds"),
])
async def test_list_options_are_validated_as_kube_apiserver_does(
        env: Env, query: str, code: int, message: str) -> None:
    got, body = await env.get(f"/namespaces/ns1/podimagepulls?{query}")
    assert got == code and body["kind"] == "Status", body
    assert message in body["message"], body["message"]
    if code == 422:
        assert body["reason"] == "Invalid" and body["details"]["kind"] == "ListOptions"
        assert body["details"]["causes"][0]["field"] in ("resourceVersionMatch",
                                                         "sendInitialEvents")


async def test_exact_is_the_state_at_that_version_or_410(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    rv = listed["metadata"]["resourceVersion"]
    for match in ("Exact", "NotOlderThan"):
        code, body = await env.get(f"/namespaces/ns1/podimagepulls?resourceVersion={rv}"
                                   f"&resourceVersionMatch={match}")
        assert code == 200 and len(body["items"]) == 1, body
        assert int(body["metadata"]["resourceVersion"]) >= int(rv)
    env.kube.put("api/v1", "pods", pod("a", labels={"v": "2"}))

    async def changed() -> bool:
        _, body = await env.get("/namespaces/ns1/podimagepulls/a")
        return bool(body["metadata"]["labels"] == {"v": "2"})

    from tests.framework.until import until
    await until(changed)
    _, now = await env.get(f"/namespaces/ns1/podimagepulls?resourceVersion={rv}"
                           "&resourceVersionMatch=NotOlderThan")
    assert int(now["metadata"]["resourceVersion"]) > int(rv)  # NotOlderThan: now
    assert now["items"][0]["metadata"]["labels"] == {"v": "2"}
    # Exact: the state at that version, rebuilt from the history
    code, exact = await env.get(f"/namespaces/ns1/podimagepulls?resourceVersion={rv}"
                                "&resourceVersionMatch=Exact")
    assert code == 200 and exact["metadata"]["resourceVersion"] == rv, exact
    assert not exact["items"][0]["metadata"].get("labels")
    col = next(iter(env.feeds.pods.parts().values())).collection
    for i in range(col._history.max_events):  # the history rolls past rv
        col.set(("ns1", f"filler-{i}"), {"metadata": {"name": f"filler-{i}",
                                                      "namespace": "ns1"}})
    code, body = await env.get(f"/namespaces/ns1/podimagepulls?resourceVersion={rv}"
                               "&resourceVersionMatch=Exact")
    assert code == 410 and body["reason"] == "Expired", body
    assert body["message"] == "The resourceVersion for the provided list is too old."


async def test_send_initial_events_false_does_not_replay_the_state(
        env: Env, quick_bookmarks: None) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    await env.get("/namespaces/ns1/podimagepulls")  # the feed holds a
    # the first event (a bookmark: the watch is running) is the cue to add b
    seen: list[tuple[str, str]] = []
    async with aiohttp.ClientSession() as s, s.get(
            env.proxy.url + GV + "/namespaces/ns1/podimagepulls?watch=1&sendInitialEvents="
            "false&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
            headers=ALICE) as resp:
        assert resp.status == 200, await resp.text()
        async with asyncio.timeout(10):
            async for line in resp.content:
                ev = json.loads(line)
                if not seen:
                    env.kube.put("api/v1", "pods", pod("b"))
                seen.append((ev["type"], ev["object"]["metadata"].get("name")))
                if seen[-1] == ("ADDED", "b"):
                    break
    assert ("ADDED", "a") not in seen, seen


async def test_initial_events_then_the_annotated_bookmark(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    for query in ("sendInitialEvents=true&resourceVersionMatch=NotOlderThan", ""):
        events, _ = await _watch(env, "/namespaces/ns1/podimagepulls?watch=1&"
                                      f"allowWatchBookmarks=true&{query}", 2)
        # (kube-apiserver's defaulting makes a watch from no version a WatchList too)
        assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"], query
        assert events[1]["object"]["metadata"]["annotations"] == {
            "k8s.io/initial-events-end": "true"}


async def test_bookmarks_carry_only_the_version(env: Env, quick_bookmarks: None) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    rv = listed["metadata"]["resourceVersion"]
    events, ended = await _watch(env, f"/namespaces/ns1/podimagepulls?watch=1&"
                                      f"resourceVersion={rv}&allowWatchBookmarks=true", 3)
    assert not ended and [e["type"] for e in events] == ["BOOKMARK"] * 3
    for e in events:
        assert set(e["object"]) == {"kind", "apiVersion", "metadata"}
        assert list(e["object"]["metadata"]) == ["resourceVersion"]
        assert int(e["object"]["metadata"]["resourceVersion"]) >= int(
            listed["items"][0]["metadata"]["resourceVersion"])


async def test_timeout_seconds_zero_is_the_servers_default(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    # kube-apiserver: 0 (or none) is --min-request-timeout randomized, not "now"
    events, ended = await _watch(
        env, "/namespaces/ns1/podimagepulls?watch=1&timeoutSeconds=0", 2,
        then=lambda: env.kube.put("api/v1", "pods", pod("a", labels={"v": "2"})))
    assert not ended and [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    # a positive timeout ends the watch (cleanly: the stream just ends)
    events, ended = await _watch(env, "/namespaces/ns1/podimagepulls?watch=1&"
                                      "timeoutSeconds=1", 2)
    assert ended and [e["type"] for e in events] == ["ADDED"]


async def test_a_watchs_initial_state_is_encoded_off_the_event_loop(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    from aggapi.apiserver.collections import watch
    monkeypatch.setattr(watch, "ENCODE_INLINE", 10)
    monkeypatch.setattr(watch, "INITIAL_SLICE", 16)
    threads: list[str] = []
    real = watch.Encoder.added

    def added(self: watch.Encoder, objs: Any, sel: Any) -> bytes:
        threads.append(threading.current_thread().name)
        return real(self, objs, sel)

    monkeypatch.setattr(watch.Encoder, "added", added)
    for i in range(40):
        env.kube.put("api/v1", "pods", pod(f"p{i:02}"))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    assert len(listed["items"]) == 40
    events, _ = await _watch(env, "/namespaces/ns1/podimagepulls?watch=1&"
                                  "allowWatchBookmarks=true", 41)
    assert sorted(e["object"]["metadata"]["name"] for e in events[:40]) == [
        f"p{i:02}" for i in range(40)]
    assert events[40]["type"] == "BOOKMARK"
    # in slices of 16, none of them on the event loop's thread
    assert len(threads) == 3 and threading.main_thread().name not in threads, threads


async def test_a_catch_up_is_written_a_chunk_at_a_time() -> None:
    """A slow watcher's catch-up never holds the whole history encoded: each chunk
    is written (waiting while the client's socket is full) before the next is made."""
    from aggapi.apiserver.collections import watch
    from aggapi.apiserver.collections.selectors import Selector
    from aggapi.apiserver.collections.store import Clock, Collection

    col = Collection(Clock())
    for v in range(300):
        col.set("a", {"metadata": {"name": "a"}, "blob": "x" * 10_000, "v": v})
    writes: list[int] = []

    class Resp:
        async def write(self, data: bytes) -> None:
            writes.append(len(data))

    enc = watch.Encoder("PodImagePull", [], lambda o: [], None, "Metadata")
    events = col.since(col.start_rv)[:watch.CATCH_UP_BATCH]
    await watch._send_changes(Resp(), events, Selector(), enc)  # type: ignore[arg-type]
    assert sum(writes) > 2_500_000 and len(writes) > 30
    assert max(writes) < watch.CHUNK_BYTES + 11_000
