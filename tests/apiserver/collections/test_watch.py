"""Watching podimagepulls: resourceVersions as kubectl and informers use them,
selectors applied to each event, Table events, 410 for a too-old version, bookmarks,
and the shared watches stopping once idle."""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections import store
from aggapi.apiserver.collections.store import Clock
from aggapi.apiserver.collections.watch import Encoder
from tests.framework.until import until

from ..conftest import GV
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
    # The delete after the watch's initial state (a watch without a version starts
    # from the state: deleted before it, "a" is never seen; 0.3 s was not enough
    # under load).
    [first] = await _take(it, 1)
    env.kube.delete("api/v1", "pods", "ns1", "a")
    [deleted] = await _take(it, 1)
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


def _kubelet_event(pod_obj: dict[str, Any], reason: str, message: str, at_ns: int,
                   count: int = 1, last_ns: int | None = None) -> dict[str, Any]:
    """As kubelet's recorder writes it: named '<pod>.<UnixNano hex>' when first seen; a
    repeat is the same Event PATCHed (count, lastTimestamp)."""
    def stamp(ns: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ns // 10**9))
    ev = event(pod_obj, reason, message, when=stamp(last_ns or at_ns))
    ev["metadata"]["name"] = f"{pod_obj['metadata']['name']}.{at_ns:x}"
    return {**ev, "count": count, "firstTimestamp": stamp(at_ns)}


async def _until_phase(it: AsyncIterator[dict[str, Any]], phase: str) -> dict[str, Any]:
    async with asyncio.timeout(5):
        async for ev in it:
            if ev["object"]["status"]["images"][0]["phase"] == phase:
                return ev
    raise AssertionError(f"the watch ended before {phase}")


T0 = 1_798_000_000 * 10**9  # a whole second, in ns


async def test_a_retry_that_finds_the_image_in_the_failures_second_is_done(
        env: Env) -> None:
    """kubelet's pull throttle refuses the pull ('pull QPS exceeded') and, 0.68 s later
    in the same second, the retry finds the image another replica pulled. The watch
    must go on from Failed to AlreadyPresent (before the fix it stayed Failed: the
    failure outranked the Pulled of its second)."""
    web = env.kube.put("api/v1", "pods", pod("web-0"))
    env.kube.put("api/v1", "events", _kubelet_event(
        web, "Pulling", 'Pulling image "registry.test/app:1"', T0 - 8 * 10**9))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    it = _events(env, f"/namespaces/ns1/podimagepulls?watch=true"
                      f"&resourceVersion={listed['metadata']['resourceVersion']}")
    for msg, ns in (('Failed to pull image "registry.test/app:1": pull QPS exceeded',
                     200_000_000), ("Error: ErrImagePull", 200_300_000)):
        env.kube.put("api/v1", "events", _kubelet_event(web, "Failed", msg, T0 + ns))
    failed = await _until_phase(it, "Failed")
    assert failed["object"]["status"]["images"][0]["reason"] == "pull QPS exceeded"
    env.kube.put("api/v1", "events", _kubelet_event(
        web, "Pulled", 'Container image "registry.test/app:1" already present on machine',
        T0 + 880_000_000))
    done = await _until_phase(it, "AlreadyPresent")
    assert done["type"] == "MODIFIED" and done["object"]["status"]["phase"] == "AlreadyPresent"


async def test_a_patched_event_and_a_pod_update_are_seen(env: Env) -> None:
    """kubelet repeats an Event by PATCHing it (count 2, a later lastTimestamp): the
    retry's Pulling is a MODIFIED Event, and the collection follows it; the pod
    running afterwards is a pod update it follows too."""
    web = env.kube.put("api/v1", "pods", pod("web-0"))
    pulling = _kubelet_event(web, "Pulling", 'Pulling image "registry.test/app:1"',
                             T0 - 40 * 10**9)
    env.kube.put("api/v1", "events", pulling)
    env.kube.put("api/v1", "events", _kubelet_event(
        web, "Failed", 'Failed to pull image "registry.test/app:1": 503', T0 - 39 * 10**9))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    assert listed["items"][0]["status"]["images"][0]["phase"] == "Failed"
    it = _events(env, f"/namespaces/ns1/podimagepulls?watch=true"
                      f"&resourceVersion={listed['metadata']['resourceVersion']}")
    env.kube.put("api/v1", "events", _kubelet_event(
        web, "Pulling", pulling["message"], T0 - 40 * 10**9, count=2, last_ns=T0))
    retry = await _until_phase(it, "Pulling")
    assert retry["object"]["status"]["images"][0]["attempt"] == 2
    running = copy.deepcopy(web)
    running["status"]["containerStatuses"] = [{
        "name": "app", "image": "registry.test/app:1", "imageID": "registry.test/app@sha256:a",
        "state": {"running": {"startedAt": "2026-12-23T04:26:41Z"}}}]  # after T0
    env.kube.put("api/v1", "pods", running)
    await _until_phase(it, "Done")


async def test_a_watch_from_another_terms_version_is_410(env: Env) -> None:
    """A version of an earlier term (another leader's, this replica's previous run) is
    not in this history: 410 Expired before any byte, and clients relist; never the
    state replayed as ADDED, which would keep objects deleted meanwhile."""
    env.kube.put("api/v1", "pods", pod("a"))
    code, listed = await env.get("/namespaces/ns1/podimagepulls")
    assert code == 200 and listed["items"]
    earlier = Clock(env.feeds.clock.epoch - 1).next()
    code, body = await env.get(f"/namespaces/ns1/podimagepulls?watch=true"
                               f"&resourceVersion={earlier}")
    assert code == 410 and body["reason"] == "Expired"


async def test_a_watch_from_a_paged_list_the_history_rolled_past(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """kubectl get -w lists in pages then watches from the first page's version; during
    a rollout the history (here 2 changes) rolls past it while the pages are read. The
    watch gets each object's net change since (not 410, which kubectl get -w exits on):
    the watcher ends with the current state."""
    monkeypatch.setattr(store, "HISTORY_EVENTS", 2)  # (the first build is not in it)
    for name in ("a", "b", "c"):
        env.kube.put("api/v1", "pods", pod(name))
    code, first = await env.get("/namespaces/ns1/podimagepulls?limit=2")
    assert code == 200 and first["metadata"]["continue"]
    rv = first["metadata"]["resourceVersion"]
    env.kube.delete("api/v1", "pods", "ns1", "a")
    env.kube.put("api/v1", "pods", pod("d"))
    for image in ("registry.test/app:2", "registry.test/app:3", "registry.test/app:4"):
        env.kube.put("api/v1", "pods", pod("b", image=image))
    await until(lambda: not env.feeds.pods.get("ns1").collection.owns(int(rv)))  # type: ignore[union-attr]
    code, rest = await env.get(f"/namespaces/ns1/podimagepulls?limit=2&continue="
                               f"{first['metadata']['continue']}")
    assert code == 200 and rest["metadata"]["resourceVersion"] == rv  # the kept state
    got = await _take(_events(env, f"/namespaces/ns1/podimagepulls?watch=true"
                                   f"&resourceVersion={rv}"), 3)
    assert sorted((e["type"], e["object"]["metadata"]["name"]) for e in got) == [
        ("ADDED", "d"), ("DELETED", "a"), ("MODIFIED", "b")]
    b = next(e["object"] for e in got if e["object"]["metadata"]["name"] == "b")
    assert b["status"]["images"][0]["image"] == "registry.test/app:4"  # only the last


async def test_each_change_is_encoded_once_for_every_plain_watcher(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every follower's mirror and every client watch each change: its object is
    encoded once, when the history takes it, and the same bytes sent to each (a Table
    watcher's row is its own)."""
    env.kube.put("api/v1", "pods", pod("a"))
    _, listed = await env.get("/namespaces/ns1/podimagepulls")
    rv = listed["metadata"]["resourceVersion"]
    encoded: list[str] = []
    line, text = Encoder._line, store.encode

    def counted(kind: str, obj: Any) -> bytes:
        encoded.append(str(obj.get("kind")))
        return line(kind, obj)

    def counted_text(obj: Any) -> bytes:
        encoded.append(str(obj.get("kind")))
        return text(obj)
    monkeypatch.setattr(Encoder, "_line", staticmethod(counted))
    monkeypatch.setattr(store, "encode", counted_text)
    path = f"/namespaces/ns1/podimagepulls?watch=true&resourceVersion={rv}"
    tasks = [asyncio.ensure_future(_take(_events(env, path), 1)) for _ in range(3)]
    tasks.append(asyncio.ensure_future(_take(_events(env, path, TABLE), 1)))
    await asyncio.sleep(0.3)
    env.kube.put("api/v1", "pods", pod("a", labels={"v": "2"}))
    got = await asyncio.gather(*tasks)
    assert [g[0]["type"] for g in got] == ["MODIFIED"] * 4
    assert got[0] == got[1] == got[2]
    assert sorted(encoded) == ["PodImagePull", "Table"]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(), _json, max_size=5),
       st.sampled_from(["ADDED", "MODIFIED", "DELETED"]))
def test_a_line_from_the_stored_text_is_the_line_encoded_whole(obj: dict[str, Any],
                                                               kind: str) -> None:
    """Plain watchers send the history's stored text wrapped: byte for byte the line
    an encoder makes of the object."""
    assert Encoder.wrap(kind, store.encode(obj)) == Encoder._line(kind, obj)
