"""limit/continue as kube-apiserver pages (each page at the first page's version, 410
once the history no longer has it) and a resourceVersion from the future (504 "Too
large resource version" after waiting for it), through the front proxy."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections import paging, store
from aggapi.apiserver.collections.paging import encode_token
from aggapi.apiserver.collections.store import Clock, Collection
from aggapi.status import StatusError
from tests.framework.until import until

from .conftest import TABLE, Env
from .fakes import pod

LIST = "/namespaces/ns1/podimagepulls"


def _names(body: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in body["items"]]


async def _list_all(env: Env, n: int) -> None:
    for i in range(n):
        env.kube.put("api/v1", "pods", pod(f"p{i:02}"))

    async def listed() -> bool:
        _, body = await env.get(LIST)
        return len(body["items"]) == n
    await until(listed)


async def test_limit_pages_at_the_first_pages_version(env: Env) -> None:
    await _list_all(env, 12)
    code, first = await env.get(f"{LIST}?limit=5")
    assert code == 200, first
    assert _names(first) == ["p00", "p01", "p02", "p03", "p04"]
    meta = first["metadata"]
    assert meta["continue"] and meta["remainingItemCount"] == 7
    # The cluster moves on between pages: one pod deleted, one added, one relabelled.
    env.kube.delete("api/v1", "pods", "ns1", "p07")
    env.kube.put("api/v1", "pods", pod("p05b"))
    env.kube.put("api/v1", "pods", pod("p09", labels={"tier": "new"}))

    async def moved() -> bool:
        _, body = await env.get(LIST)
        return "p07" not in _names(body) and "p05b" in _names(body)
    await until(moved)
    names, token = _names(first), meta["continue"]
    pages = 1
    while token:
        code, page = await env.get(f"{LIST}?limit=5&continue={quote(token)}")
        assert code == 200, page
        assert page["metadata"]["resourceVersion"] == meta["resourceVersion"]
        names += _names(page)
        token = page["metadata"].get("continue", "")
        pages += 1
        if page["metadata"].get("continue"):
            assert page["metadata"]["remainingItemCount"] == 12 - len(names)
    # exactly the state at the first page's version: p07 still there, p05b not yet,
    # p09 with its old labels
    assert names == [f"p{i:02}" for i in range(12)] and pages == 3
    _, p09 = await env.get(f"{LIST}?limit=2&continue="
                           + quote(encode_token(int(meta["resourceVersion"]), ("ns1", "p08"))))
    assert p09["items"][0]["metadata"]["labels"] == {}


async def test_limit_with_selectors_and_tables(env: Env) -> None:
    await _list_all(env, 4)
    code, body = await env.get(f"{LIST}?limit=3&labelSelector=x!%3Dy", accept=TABLE)
    assert code == 200 and body["kind"] == "Table" and len(body["rows"]) == 3
    assert body["metadata"]["continue"] and "remainingItemCount" not in body["metadata"]
    code, body = await env.get(f"{LIST}?limit=4")
    assert code == 200 and len(body["items"]) == 4 and "continue" not in body["metadata"]


def _roll_history(env: Env) -> Collection:
    """One change more than the history holds: it no longer covers an earlier version
    (a 10,000-pod rollout does this in seconds; the first build is not in it)."""
    col = next(iter(env.feeds.pods.parts().values())).collection
    for i in range(col._history.max_events + 1):
        col.set(("ns1", f"filler-{i}"), {"metadata": {"name": f"filler-{i}",
                                                      "namespace": "ns1"}})
    return col


async def test_continue_after_the_history_rolled_past_is_served(env: Env) -> None:
    """kubectl get -A pages 500 at a time: its later pages must not be 410 because
    the collection changed more than its history holds meanwhile (a paged list's state
    is kept for its pages)."""
    await _list_all(env, 3)
    _, first = await env.get(f"{LIST}?limit=1")
    _roll_history(env)
    names, token = _names(first), first["metadata"]["continue"]
    while token:
        code, page = await env.get(f"{LIST}?limit=1&continue={quote(token)}")
        assert code == 200, page
        assert page["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        names += _names(page)
        token = page["metadata"].get("continue", "")
    assert names == ["p00", "p01", "p02"]  # the state then: no filler


async def test_continue_older_than_the_history_is_410(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    await _list_all(env, 3)
    _, first = await env.get(f"{LIST}?limit=1")
    token = first["metadata"]["continue"]
    _roll_history(env)
    monkeypatch.setattr(store, "SNAPSHOT_SECONDS", -1.0)  # the kept state dropped
    code, body = await env.get(f"{LIST}?limit=1&continue={quote(token)}")
    assert code == 410 and body["reason"] == "Expired", body
    assert body["message"].startswith("The provided continue parameter is too old")
    # a version from before the collection started is just as expired
    code, body = await env.get(f"{LIST}?limit=1&continue=" + quote(encode_token(1, ("", ""))))
    assert code == 410 and body["reason"] == "Expired"


def test_kept_states_are_bounded_and_end_with_the_term() -> None:
    col = Collection(Clock(1), history=4)
    versions = []
    for i in range(store.SNAPSHOTS + 1):
        col.set(f"k{i}", {"metadata": {"name": f"k{i}"}})
        col.keep_state(col.rv, col.objects)
        versions.append(col.rv)
    for i in range(8):  # the history rolls past every kept version
        col.set(f"x{i}", {"metadata": {"name": f"x{i}"}})
    assert set(col.state_at(versions[-1])) == {f"k{i}" for i in range(store.SNAPSHOTS + 1)}
    with pytest.raises(StatusError) as err:  # the oldest kept state went first
        col.state_at(versions[0])
    assert err.value.code == 410
    col.close()  # a new term: nothing of the old one is served
    with pytest.raises(StatusError):
        col.state_at(versions[-1])


async def test_bad_continue_is_400(env: Env) -> None:
    await _list_all(env, 2)
    _, first = await env.get(f"{LIST}?limit=1")
    token = first["metadata"]["continue"]
    forged = base64.urlsafe_b64encode(json.dumps({"rv": "x"}).encode()).decode()
    for query in ("continue=%%%", f"continue={forged}", "limit=abc",
                  f"continue={quote(token)}&resourceVersion=5"):
        code, body = await env.get(f"{LIST}?{query}")
        assert code == 400 and body["reason"] == "BadRequest", (query, body)


FUTURE = str(1 << 80)  # a term far ahead of any leader's


@pytest.mark.parametrize("watch", [False, True])
async def test_a_version_from_the_future_is_too_large(
        env: Env, monkeypatch: pytest.MonkeyPatch, watch: bool) -> None:
    monkeypatch.setattr(store, "TOO_LARGE_WAIT", 0.2)
    await _list_all(env, 1)
    code, body = await env.get(f"{LIST}?resourceVersion={FUTURE}"
                               + ("&watch=true" if watch else ""))
    assert code == 504, body
    assert body["reason"] == "Timeout" and body["details"]["retryAfterSeconds"] == 1
    assert body["message"].startswith(f"Timeout: Too large resource version: {FUTURE}")
    assert body["details"]["causes"] == [{"reason": "ResourceVersionTooLarge",
                                          "message": "Too large resource version"}]
    # the 99999999999999999 is a term long past (versions are epoch << 32 |
    # sequence): not in this history, so a watch from it is 410 and a client relists
    if watch:
        code, body = await env.get(f"{LIST}?resourceVersion=99999999999999999&watch=true")
        assert code == 410 and body["reason"] == "Expired"


async def test_a_version_a_moment_ahead_is_waited_for(env: Env) -> None:
    """The next change's version (a client that saw it elsewhere first) is served
    once this history has it."""
    await _list_all(env, 1)
    _, first = await env.get(LIST)
    ahead = int(first["metadata"]["resourceVersion"]) + 1
    answer = asyncio.ensure_future(env.get(f"{LIST}?resourceVersion={ahead}"))
    await asyncio.sleep(0.1)
    env.kube.put("api/v1", "pods", pod("p01"))
    code, body = await answer
    assert code == 200 and _names(body) == ["p00", "p01"]


OPS = st.lists(st.tuples(st.sampled_from("abcde"), st.one_of(st.none(), st.integers(0, 3))),
               max_size=30)


@settings(derandomize=True, database=None, max_examples=200)
@given(OPS, OPS, st.integers(4, 40))
def test_state_at_any_covered_version_is_the_state_then(
        before: list[tuple[str, int | None]], after: list[tuple[str, int | None]],
        history: int) -> None:
    col = Collection(Clock(1), history=history)
    for k, v in before:
        col.set(k, None if v is None else {"metadata": {"name": k}, "v": v})
    then = {k: dict(o) for k, o in col.objects.items()}
    rv = col.rv
    for k, v in after:
        col.set(k, None if v is None else {"metadata": {"name": k}, "v": v})
    try:
        state = col.state_at(rv)
    except StatusError as err:
        assert err.code == 410 and len(col._history) == history
        return
    assert state == then


# (namespace, name, selected) triples; names repeat across namespaces.
OBJS = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.text("xyz0", max_size=4),
                          st.booleans()), max_size=60)


@settings(derandomize=True, database=None, max_examples=300)
@given(OBJS, st.integers(0, 12), st.booleans())
def test_pages_of_a_sorted_selection_are_the_selection_in_order(
        triples: list[tuple[str, str, bool]], limit: int, selector: bool) -> None:
    objs: list[dict[str, Any]] = list(
        {(ns, name): {"metadata": {"namespace": ns, "name": name}, "sel": sel}
         for ns, name, sel in triples}.values())

    def matches(o: dict[str, Any]) -> bool:
        return bool(o["sel"]) or not selector
    want = sorted((o["metadata"]["namespace"], o["metadata"]["name"])
                   for o in objs if matches(o))
    selected = paging.order(reversed(objs), matches)
    got: list[tuple[str, str]] = []
    req = paging.PageRequest(limit, None, None)
    while True:
        page = paging.cut(selected, req, 7, count_remaining=not selector)
        got += [paging.object_key(o) for o in page.items]
        if not page.cont:
            break
        assert len(page.items) == limit
        assert page.remaining == (None if selector else len(want) - len(got))
        rv, after = paging.decode_token(page.cont)
        assert rv == 7 and after == got[-1]
        req = paging.PageRequest(limit, rv, after)
    assert got == want


async def test_a_paged_list_sorts_its_selection_once(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each page of 500 of a 50,000-object list sorted the whole state again (~0.6 s of
    the loop a page); the first page's sorted selection is kept for the later ones."""
    await _list_all(env, 12)
    sorts = []
    real = paging.order

    def counted(*args: Any) -> list[dict[str, Any]]:
        sorts.append(1)
        return real(*args)
    monkeypatch.setattr(paging, "order", counted)
    for query in ("", "&labelSelector=x!%3Dy"):
        sorts.clear()
        code, body = await env.get(f"{LIST}?limit=2{query}")
        names, token = _names(body), body["metadata"]["continue"]
        while token:
            code, body = await env.get(f"{LIST}?limit=2{query}&continue={quote(token)}")
            assert code == 200, body
            names += _names(body)
            token = body["metadata"].get("continue", "")
        assert names == [f"p{i:02}" for i in range(12)] and len(sorts) == 1, (query, sorts)
