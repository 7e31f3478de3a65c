"""bench_scale --replay's own counting (benchmarks._replay_clients.Tally): a watcher
fed a repeated event counts one duplicate; a change it never got counts as lost
against the fresh list; the fake kube-apiserver's key-ordered pages miss no object
while objects are added between pages."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from benchmarks._replay_clients import Tally, fresh_versions
from benchmarks._replay_kube import ReplayKube


def obj(name: str, rv: int, phase: str = "Pulling") -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name, "resourceVersion": str(rv)},
            "status": {"phase": phase}}


def listed() -> Tally:
    t = Tally()
    t.listed([obj("a", 5), obj("b", 7)], "10", now=1.0)
    return t


def test_every_change_once_counts_nothing() -> None:
    t = listed()
    t.event("MODIFIED", obj("a", 11, "Done"), now=2.0)
    t.event("ADDED", obj("c", 12), now=2.0)
    t.event("BOOKMARK", {"metadata": {"resourceVersion": "13"}}, now=2.0)
    t.event("DELETED", obj("b", 14), now=2.0)
    fresh = fresh_versions([obj("a", 11, "Done"), obj("c", 12)])
    assert (t.duplicates, t.lost(fresh), t.done_at) == (0, 0, {"ns/a": 2.0})


def test_a_repeated_event_is_one_duplicate() -> None:
    t = listed()
    t.event("MODIFIED", obj("a", 11), now=2.0)
    t.event("MODIFIED", obj("a", 11), now=2.0)
    assert t.duplicates == 1
    t.event("MODIFIED", obj("b", 9), now=2.0)  # older than the list: replayed history
    assert t.duplicates == 2


def test_a_missed_change_is_lost_against_the_fresh_list() -> None:
    t = listed()
    t.event("MODIFIED", obj("a", 11), now=2.0)
    fresh = fresh_versions([obj("a", 11), obj("b", 12), obj("c", 13)])
    assert t.lost(fresh) == 2  # b's change and c's ADDED never came
    t.event("MODIFIED", obj("d", 14), now=2.0)  # a change to one never added
    assert t.unknown == 1 and t.lost({**fresh, "ns/d": 14}) == 3


async def test_the_fake_apiservers_pages_miss_nothing_added_between_them() -> None:
    kube = ReplayKube()
    for i in range(0, 40, 2):
        kube.put("api/v1", "pods", {"metadata": {"namespace": "ns", "name": f"p{i:02d}"}})
    async with TestClient(TestServer(kube.app())) as client:
        names: list[str] = []
        cont, added = "", False
        while True:
            q = {"limit": "7", **({"continue": cont} if cont else {})}
            body = await (await client.get("/api/v1/namespaces/ns/pods", params=q)).json()
            names += [o["metadata"]["name"] for o in body["items"]]
            if not added:  # before the next page: one before the cursor, one after
                kube.put("api/v1", "pods", {"metadata": {"namespace": "ns", "name": "p01"}})
                kube.put("api/v1", "pods", {"metadata": {"namespace": "ns", "name": "p39"}})
                added = True
            cont = body["metadata"].get("continue", "")
            if not cont:
                break
    assert names == [f"p{i:02d}" for i in range(0, 40, 2)] + ["p39"]


def test_a_relists_unseen_done_counts_with_its_latency() -> None:
    """Only the first list's Dones came before the watcher: a Done it missed while it
    listed again (after a 410) reached it at the re-list, late, and must be counted."""
    t = listed()  # a and b not Done: nothing to count yet
    t.listed([obj("a", 11, "Done"), obj("b", 12, "Done")], "12", now=5.0)
    assert t.done_at == {"ns/a": 5.0, "ns/b": 5.0}
    first = Tally()
    first.listed([obj("a", 11, "Done")], "11", now=1.0)
    assert first.done_at == {"ns/a": -1.0}  # before the first list: no latency
    first.event("MODIFIED", obj("b", 12, "Done"), now=2.0)
    first.listed([obj("a", 11, "Done"), obj("b", 12, "Done")], "12", now=9.0)
    assert first.done_at == {"ns/a": -1.0, "ns/b": 2.0}  # seen once, at its event


def test_the_longest_gap_between_changes_is_kept() -> None:
    """watch_gap_max_s: the longest a watcher went without a change once they flowed;
    a re-list delivers changes, a bookmark does not."""
    t = listed()
    assert t.gap_max == 0.0  # the first list does not start the clock
    t.event("MODIFIED", obj("a", 11), now=2.0)
    t.event("BOOKMARK", {"metadata": {"resourceVersion": "12"}}, now=3.0)
    t.event("MODIFIED", obj("a", 13), now=4.5)
    t.listed([obj("a", 13), obj("b", 14)], "14", now=10.5)
    t.event("MODIFIED", obj("b", 15), now=11.0)
    assert t.gap_max == 6.0


async def test_a_paged_lists_version_is_its_first_pages_so_a_watch_misses_no_change() -> None:
    # A real kube-apiserver lists every page from one snapshot: the version the last
    # page names is the first page's, and a watch from it brings every change made
    # while the pages were read. Naming the newest version instead lost the changes to
    # objects of the pages already read (2,855 pulls never Done in a replay).
    kube = ReplayKube()
    for i in range(20):
        kube.put("api/v1", "pods", {"metadata": {"namespace": "ns", "name": f"p{i:02d}"}})
    async with TestClient(TestServer(kube.app())) as client:
        cont, versions, changed = "", [], False
        while True:
            q = {"limit": "7", **({"continue": cont} if cont else {})}
            body = await (await client.get("/api/v1/namespaces/ns/pods", params=q)).json()
            versions.append(body["metadata"]["resourceVersion"])
            if not changed:  # an object of the page just read changes
                kube.put("api/v1", "pods", {"metadata": {"namespace": "ns", "name": "p00",
                                                         "labels": {"done": "yes"}}})
                changed = True
            cont = body["metadata"].get("continue", "")
            if not cont:
                break
        assert len(set(versions)) == 1 and len(versions) == 3
        resp = await client.get("/api/v1/namespaces/ns/pods", params={
            "watch": "1", "resourceVersion": versions[-1], "timeoutSeconds": "1"})
        lines = [line for line in (await resp.text()).splitlines() if line.strip()]
    assert any('"done": "yes"' in line or '"done":"yes"' in line for line in lines)


def test_latency_is_binned_by_when_the_pull_ended() -> None:
    from benchmarks._replay_report import by_window
    rows = by_window([(100.5, 0.1), (101.0, 0.3), (107.0, 9.0)], t0=100.0)
    assert rows == [[0.0, 2, 0.3, 0.3, 0.3], [5.0, 1, 9.0, 9.0, 9.0]]


async def test_the_fake_apiservers_watches_get_the_changes_after_their_version() -> None:
    """Each change is encoded once for every watch: a watch from version V gets the
    changes after V in order, filtered by its field selector; one from before the
    history it keeps gets kube-apiserver's 410."""
    kube = ReplayKube(history=4)
    for i in range(6):
        kube.put("api/v1", "events", {"metadata": {"namespace": "ns", "name": f"e{i}"},
                                      "involvedObject": {"kind": "Pod" if i % 2 else "Node"}})
    async with TestClient(TestServer(kube.app())) as client:
        async def watch(rv: int, fsel: str = "") -> list[dict[str, Any]]:
            resp = await client.get("/api/v1/events", params={
                "watch": "1", "resourceVersion": str(rv), "timeoutSeconds": "1",
                **({"fieldSelector": fsel} if fsel else {})})
            return [json.loads(line) for line in (await resp.text()).splitlines() if line]

        got = await watch(kube.rv - 3, "involvedObject.kind=Pod")
        assert [e["object"]["metadata"]["name"] for e in got] == ["e3", "e5"]
        assert {e["type"] for e in got} == {"ADDED"}
        assert len(await watch(kube.rv - 3)) == 3
        old = await watch(kube.rv - 6)
        assert [e["type"] for e in old] == ["ERROR"] and old[0]["object"]["code"] == 410


async def test_requests_go_to_ready_replicas_only() -> None:
    """As the aggregator once a terminating replica's endpoint is not ready: none to
    it while another is ready; any when none is."""
    from benchmarks._replay_clients import Replicas
    replicas = Replicas(["a", "b", "c"], "token", seed=1)
    try:
        replicas.ready = [False, True, False]
        assert {replicas.pick() for _ in range(50)} == {"b"}
        replicas.ready = [False, False, False]
        assert {replicas.pick() for _ in range(50)} == {"a", "b", "c"}
    finally:
        await replicas.close()
