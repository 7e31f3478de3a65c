"""The leader's warm cluster-wide feed (--collection-warm): started with its term, not
by the first request, and held for the whole term (never stopped by the linger)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections import feedset
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.parts import Parts
from aggapi.apiserver.podsources import Sources
from aggapi.apiserver.routes import Route
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from ..conftest import Server
from .fakes import FakeAgent, pod

LINGER = 0.2


def warm_feeds(parts: Parts, on_warm: Any = None) -> Feeds:
    return Feeds(Sources(parts.kube_api, linger=LINGER), cast(AgentClient, FakeAgent()),
                 linger=LINGER, poll_interval=0.05, warm=True, on_warm=on_warm)


def built(feeds: Feeds) -> set[str]:
    feed = feeds.pods.get("")
    if feed is None or not feed.synced.is_set():
        return set()
    return {str(cast(tuple[str, str], k)[1]) for k in feed.collection.objects}


async def test_a_lone_replica_builds_every_object_before_the_first_request(
        make_server: Any, kube: FakeKube) -> None:
    kube.put("api/v1", "pods", pod("a"))
    kube.put("api/v1", "pods", pod("b", namespace="ns2"))

    def setup(parts: Parts) -> list[Route]:
        parts.feeds = warm_feeds(parts)
        return []

    server: Server = await make_server(setup=setup, collection_warm=True)
    feeds = server.parts.feeds
    # No request has come: the objects are built, from one pod and one event watch.
    await until(lambda: built(feeds) == {"a", "b"} and kube.watching("pods") == 1
                and kube.watching("events") == 1)
    # A namespace's user finds it (no pair of its own), and its release, past the
    # linger, stops nothing: the term holds the feed.
    async with feeds.pods_of("ns1") as used:
        assert used is feeds.pods.get("")
    await asyncio.sleep(LINGER * 3)
    assert built(feeds) == {"a", "b"} and kube.watching("pods") == 1


async def test_each_term_starts_its_feed_and_a_lost_term_lets_it_go(
        make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    kube.put("api/v1", "pods", pod("a"))
    monkeypatch.setattr(feedset, "WARM_SETTLE", 0.0)
    server: Server = await make_server()
    warmed: list[set[str]] = []  # what was built each time on_warm ran (the GC freeze)
    feeds: Feeds = warm_feeds(server.parts, lambda: warmed.append(built(feeds)))
    try:
        await feeds.new_term(1000)
        await until(lambda: built(feeds) == {"a"})
        await until(lambda: warmed == [{"a"}])
        await feeds.new_term(None)  # another replica leads now
        assert feeds.pods.get("") is None
        await until(lambda: kube.watching("pods") == 0)
        kube.put("api/v1", "pods", pod("c"))
        await feeds.new_term(1001)  # leads again: a new feed, its own history
        await until(lambda: built(feeds) == {"a", "c"})
        await until(lambda: warmed == [{"a"}, {"a", "c"}])
    finally:
        await feeds.close()


async def test_a_term_starts_from_a_mirror_only_below_its_epoch(make_server: Any,
                                                                 kube: FakeKube) -> None:
    """A mirror whose versions are not below the new term's epoch is not used (epochs
    only grow: a new term must stamp above every version it serves); one below is, and
    its cluster-wide feed is held for the term with collection_warm off."""
    from aggapi.apiserver.collections.store import EPOCH_SHIFT, Clock, Collection

    kube.put("api/v1", "pods", pod("a"))
    srv: Server = await make_server()
    feeds = srv.parts.feeds
    ahead = Collection(Clock(50))
    ahead.reset({}, (50 << EPOCH_SHIFT) + 3)
    await feeds.new_term(40, seed=ahead)
    feed = feeds.pods.get("")
    assert feed is None or not feed.seeded
    behind = Collection(Clock(0))
    behind.reset({}, (45 << EPOCH_SHIFT) + 3)
    await feeds.new_term(46, seed=behind)
    feed = feeds.pods.get("")
    assert feed is not None and feed.seeded and feed.collection is behind
    await until(feed.synced.is_set)
    await asyncio.sleep(LINGER * 3)  # no user: still held for the term
    assert feeds.pods.get("") is feed and feed.collection.rv > (46 << EPOCH_SHIFT)


async def test_a_replica_is_not_ready_until_its_collections_are_built(
        make_server: Any, kube: FakeKube, monkeypatch: pytest.MonkeyPatch) -> None:
    """/readyz waits for the leader's first build (kube-apiserver's readyz waits for its
    informers the same way): a list then never waits for a cold build of every pod, nor
    finds a replica that is ready and has nothing built. Once built, a replica stays
    ready (a new term does not make it unready)."""
    from aggapi.apiserver.collections.feeds import PodFeed

    kube.put("api/v1", "pods", pod("a"))
    listing = asyncio.Event()  # the build is held until set
    first_sync = PodFeed._first_sync

    async def held(self: PodFeed) -> None:
        await listing.wait()
        await first_sync(self)

    monkeypatch.setattr(PodFeed, "_first_sync", held)

    def setup(parts: Parts) -> list[Route]:
        parts.feeds = warm_feeds(parts)
        return []

    server: Server = await make_server(setup=setup, collection_warm=True)

    async def readyz() -> tuple[int, str]:
        async with server.session().get("/readyz?verbose") as resp:
            return resp.status, await resp.text()

    await until(lambda: kube.watching("pods") == 1)
    status, text = await readyz()
    assert status == 503 and "[-]collections failed" in text, text
    listing.set()
    await until(lambda: built(server.parts.feeds) == {"a"})
    await until(server.parts.feeds.built.is_set)
    status, text = await readyz()
    assert status == 200 and "[+]collections ok" in text, text
    await server.parts.feeds.new_term(None)  # another replica leads now
    assert (await readyz())[0] == 200


def test_readiness_waits_for_no_build_without_a_warm_feed_and_not_for_ever(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a warm feed nothing is built at start (the first request builds); a
    build that never ends (no right to list pods) stops blocking readiness after
    BUILT_WAIT, so that pods/copy and imagepullprogress are served."""
    sources = cast(Sources, None)
    cold = Feeds(sources, None, linger=LINGER, poll_interval=1.0, warm=False)
    assert cold.complete()
    warm = Feeds(sources, None, linger=LINGER, poll_interval=1.0, warm=True)
    assert not warm.complete()
    monkeypatch.setattr(feedset, "BUILT_WAIT", -1.0)
    assert warm.complete()


async def test_a_terms_mirrored_feed_is_there_from_the_moment_it_serves(
        make_server: Any, kube: FakeKube) -> None:
    """The term serves once its epoch is set: while the old term's feeds close (awaits),
    a watch from a mirrored version must find the feed holding it, not build a
    namespace's own (410: a graceful leader change's watcher relisted)."""
    from aggapi.apiserver.collections.store import EPOCH_SHIFT, Clock, Collection

    kube.put("api/v1", "pods", pod("a"))
    srv: Server = await make_server()
    feeds = srv.parts.feeds
    await feeds.new_term(60)
    async with feeds.pods_of("ns1"):
        pass  # the old term has a namespace's feed to close
    mirrored = Collection(Clock(0))
    mirrored.reset({}, (60 << EPOCH_SHIFT) + 7)
    seen: list[bool] = []

    async def probe() -> None:  # a request, at the first turn the term serves
        while feeds.term != 61:  # noqa: ASYNC110 (each loop turn, as a request would)
            await asyncio.sleep(0)
        seen.append(feeds.pods.get("") is not None)
    watching = asyncio.ensure_future(probe())
    await feeds.new_term(61, seed=mirrored)
    await watching
    assert seen == [True], "the term served before its cluster-wide feed was there"
