"""Watching podimagepulls: resourceVersions as kubectl and informers use them,
selectors applied to each event, Table events, 410 for a too-old version, bookmarks,
and the shared watches stopping once idle."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from ..conftest import GV, until
from .conftest import TABLE, Env
from .fakes import event, pod

ALICE = {"Authorization": "Bearer alice-token"}


async def _events(env: Env, path: str, accept: str = "application/json"
                  ) -> AsyncIterator[dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.get(
            env.proxy.url + GV + path, headers={**ALICE, "Accept": accept}) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if line.strip():
                yield json.loads(line)


async def _take(it: AsyncIterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    out = []
    async with asyncio.timeout(5):
        async for ev in it:
            out.append(ev)
            if len(out) == n:
                break
    return out


async def test_list_then_watch_from_its_version(env: Env) -> None:
    web = env.kube.put("api/v1", "pods", pod("web-0", labels={"app": "web"}))
    env.kube.put("api/v1", "pods", pod("db-0", labels={"app": "db"}))
    _, listed = await env.get("/namespaces/ns1/podimagepulls?labelSelector=app%3Dweb")
    rv = listed["metadata"]["resourceVersion"]
    it = _events(env, f"/namespaces/ns1/podimagepulls?watch=true&labelSelector=app%3Dweb"
                      f"&resourceVersion={rv}")
    task = asyncio.ensure_future(_take(it, 3))
    await asyncio.sleep(0.2)
    env.kube.put("api/v1", "events", event(web, "Pulling", 'Pulling image "x"'))
    env.kube.put("api/v1", "pods", pod("db-0", labels={"app": "db", "v": "2"}))  # not seen
    await asyncio.sleep(0.2)
    env.kube.put("api/v1", "pods", pod("web-0", labels={"app": "other"}))  # leaves: DELETED
    await asyncio.sleep(0.2)
    env.kube.put("api/v1", "pods", pod("web-0", labels={"app": "web"}))  # back: ADDED
    got = await task
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
        ("MODIFIED", "web-0"), ("DELETED", "web-0"), ("ADDED", "web-0")]
    assert got[0]["object"]["status"]["images"][0]["phase"] == "Pulling"
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in got]
    assert int(rv) < rvs[0] < rvs[1] < rvs[2]


async def test_watch_without_version_starts_with_the_state(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    env.kube.put("api/v1", "pods", pod("b"))
    got = await _take(_events(env, "/namespaces/ns1/podimagepulls?watch=true"), 2)
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in got) == [
        ("ADDED", "a"), ("ADDED", "b")]


async def test_table_watch_events_are_one_row_tables(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    it = _events(env, "/watch/namespaces/ns1/podimagepulls", accept=TABLE)
    task = asyncio.ensure_future(_take(it, 2))
    await asyncio.sleep(0.3)
    env.kube.delete("api/v1", "pods", "ns1", "a")
    first, deleted = await task
    for ev in (first, deleted):
        assert ev["object"]["kind"] == "Table" and len(ev["object"]["rows"]) == 1
        assert ev["object"]["rows"][0]["cells"][0] == "a"
    assert (first["type"], deleted["type"]) == ("ADDED", "DELETED")
    assert [c["name"] for c in first["object"]["columnDefinitions"]][:3] == [
        "Name", "Node", "Images"]


async def test_too_old_version_is_410(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    code, body = await env.get(f"/namespaces/ns1/podimagepulls?watch=true&resourceVersion="
                               f"{int(listed['metadata']['resourceVersion']) - 10**9}")
    assert code == 410 and body["reason"] == "Expired" and body["kind"] == "Status"


async def test_initial_events_end_with_a_bookmark(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    got = await _take(_events(env, "/namespaces/ns1/podimagepulls?watch=true&"
                              "sendInitialEvents=true&allowWatchBookmarks=true&"
                              "resourceVersionMatch=NotOlderThan"), 2)
    assert [e["type"] for e in got] == ["ADDED", "BOOKMARK"]
    meta = got[1]["object"]["metadata"]
    assert meta["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert int(meta["resourceVersion"]) >= int(got[0]["object"]["metadata"]["resourceVersion"])


async def test_shared_watches_stop_when_idle(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a"))
    env.kube.put("api/v1", "pods", pod("b", namespace="ns2"))
    await env.get("/namespaces/ns1/podimagepulls")
    await env.get("/namespaces/ns2/podimagepulls")
    assert env.kube.watching("pods") == 2 and env.feeds.watches() == 4
    # past the linger (1 s in these tests) nothing is held on kube-apiserver
    await until(lambda: env.kube.watching("pods") == 0 and env.kube.watching("events") == 0,
                within=10)
    assert env.feeds.watches() == 0
