"""podimagepulls and nodeimagepulls through the front proxy: list, get, selectors,
Table output, authorization, and what they cost on kube-apiserver."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from aggapi.apiserver.collections import feeds, listbody
from tests.framework.until import until

from .conftest import TABLE, Env
from .fakes import event, node_view, pod, pull


async def test_list_merges_kubelet_and_the_node_view(env: Env) -> None:
    web = env.kube.put("api/v1", "pods", pod("web-0", labels={"app": "web"}))
    env.kube.put("api/v1", "pods", pod("db-0", "registry.test/db:1", labels={"app": "db"}))
    env.kube.put("api/v1", "events", event(web, "Pulling", 'Pulling image "registry.test/app:1"'))
    env.agent.views["node-a"] = node_view(
        pull("registry.test/app", progress=250, total=1000, rate=50.0))
    code, body = await env.get("/namespaces/ns1/podimagepulls?labelSelector=app%3Dweb")
    assert code == 200, body
    assert body["kind"] == "PodImagePullList" and int(body["metadata"]["resourceVersion"]) > 0
    [item] = body["items"]
    assert item["metadata"]["name"] == "web-0" and item["metadata"]["labels"] == {"app": "web"}
    assert item["spec"] == {"nodeName": "node-a"}
    [image] = item["status"]["images"]
    assert (image["phase"], image["progress"], image["total"]) == ("Downloading", 250, 1000)
    assert image["bytesPerSecond"] == 50.0 and image["etaSeconds"] == 15.0
    assert image["waitingForSlot"] is False


async def test_stuck_reason_and_waiting_for_a_slot(env: Env) -> None:
    bad = env.kube.put("api/v1", "pods", pod("bad", "registry.test/nope:1"))
    env.kube.put("api/v1", "events", event(bad, "Pulling", 'Pulling image "x"'))
    env.kube.put("api/v1", "events", event(
        bad, "Failed", 'Failed to pull image "registry.test/nope:1": not found',
        when="2026-01-01T00:00:02Z"))
    queued = env.kube.put("api/v1", "pods", pod("queued", "registry.test/q:1", node="node-b"))
    env.kube.put("api/v1", "events", event(queued, "Pulling", 'Pulling image "x"'))
    # node-b's one slot is taken by another namespace's pull.
    env.agent.views["node-b"] = node_view(
        pull("registry.test/other", progress=1, total=9), limit=1)
    code, body = await env.get("/namespaces/ns1/podimagepulls")
    assert code == 200
    by_name = {i["metadata"]["name"]: i["status"]["images"][0] for i in body["items"]}
    assert by_name["bad"]["phase"] == "Failed" and by_name["bad"]["reason"] == "not found"
    assert by_name["queued"]["phase"] == "Waiting" and by_name["queued"]["waitingForSlot"]
    assert by_name["queued"]["slots"] == {"used": 1, "limit": 1}
    # the other tenant's pull is a count, never its image or bytes
    assert "registry.test/other" not in str(body) and by_name["queued"]["progress"] is None


async def test_field_selectors_and_get(env: Env) -> None:
    for name, node in (("a", "node-a"), ("b", "node-b"), ("c", "node-b")):
        env.kube.put("api/v1", "pods", pod(name, node=node))
    env.kube.put("api/v1", "pods", pod("x", namespace="ns2", node="node-b"))
    code, body = await env.get("/namespaces/ns1/podimagepulls?fieldSelector=spec.nodeName%3Dnode-b")
    assert [i["metadata"]["name"] for i in body["items"]] == ["b", "c"]
    code, body = await env.get("/podimagepulls?fieldSelector=spec.nodeName%3Dnode-b,"
                               "metadata.namespace!%3Dns1")
    assert code == 200 and [i["metadata"]["name"] for i in body["items"]] == ["x"]
    code, body = await env.get("/podimagepulls?fieldSelector=metadata.name%3Da")
    assert [i["metadata"]["name"] for i in body["items"]] == ["a"]
    code, body = await env.get("/namespaces/ns1/podimagepulls/c")
    assert code == 200 and body["kind"] == "PodImagePull" and body["spec"]["nodeName"] == "node-b"
    code, body = await env.get("/namespaces/ns1/podimagepulls/nope")
    assert code == 404 and body["kind"] == "Status"


async def test_bad_selectors_and_versions_are_400(env: Env) -> None:
    for query in ("fieldSelector=status.phase%3DRunning", "labelSelector=a%20in%20(b",
                  "labelSelector=-bad-%3Dx", "fieldSelector=metadata.name",
                  "resourceVersion=abc", "watch=true&resourceVersion=12x",
                  "includeObject=Everything"):
        code, body = await env.get(f"/namespaces/ns1/podimagepulls?{query}")
        assert code == 400 and body["kind"] == "Status" and body["reason"] == "BadRequest", query


async def test_table_columns_and_include_object(env: Env) -> None:
    web = pod("web-0", labels={"app": "web"})
    web["metadata"]["creationTimestamp"] = time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 330))
    env.kube.put("api/v1", "pods", web)
    code, body = await env.get("/namespaces/ns1/podimagepulls", accept=TABLE)
    assert code == 200 and body["kind"] == "Table" and body["apiVersion"] == "meta.k8s.io/v1"
    names = [c["name"] for c in body["columnDefinitions"] if c["priority"] == 0]
    # AGE as kubectl shows it for pods (no Age column at 95095d5)
    assert names == ["Name", "Node", "Images", "Phase", "Progress", "Rate", "ETA", "Age"]
    [row] = body["rows"]
    assert row["cells"][:4] == ["web-0", "node-a", "0/1", "Pending"]
    assert row["cells"][7] in ("5m30s", "5m31s", "5m32s")
    assert row["object"]["kind"] == "PartialObjectMetadata"  # kubectl's default
    assert row["object"]["metadata"]["labels"] == {"app": "web"}
    _, full = await env.get("/namespaces/ns1/podimagepulls?includeObject=Object", accept=TABLE)
    assert full["rows"][0]["object"]["kind"] == "PodImagePull"
    _, bare = await env.get("/namespaces/ns1/podimagepulls?includeObject=None",
                            accept="application/json;as=Table;v=v1beta1;g=meta.k8s.io")
    assert bare["apiVersion"] == "meta.k8s.io/v1beta1" and "object" not in bare["rows"][0]
    code, _ = await env.get("/namespaces/ns1/podimagepulls",
                            accept="application/json;as=PartialObjectMetadataList;v=v1;"
                                   "g=meta.k8s.io")
    assert code == 406


async def test_node_image_pulls(env: Env) -> None:
    queued = env.kube.put("api/v1", "pods", pod("queued", "registry.test/q:1", node="node-b"))
    env.kube.put("api/v1", "events", event(queued, "Pulling", 'Pulling image "x"'))
    env.agent.views["node-a"] = node_view()
    env.agent.views["node-b"] = node_view(
        pull("registry.test/other", progress=1, total=9), limit=1)
    code, body = await env.get("/nodeimagepulls")
    assert code == 200 and body["kind"] == "NodeImagePullList"
    by_name = {i["metadata"]["name"]: i["status"] for i in body["items"]}
    assert by_name["node-a"]["pulling"] == 0
    assert by_name["node-b"]["slots"]["limit"] == 1
    assert by_name["node-b"]["waitingPods"] == ["ns1/queued"]
    code, table = await env.get("/nodeimagepulls/node-b", accept=TABLE)
    assert [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0] == [
        "Name", "Pulling", "Slots", "Waiting Pods", "Age"]
    assert table["rows"][0]["cells"][:4] == ["node-b", 1, "1/1", 1]
    assert table["rows"][0]["cells"][4].endswith("d")  # since its agent (2026-01-01)


async def test_authorized_as_served(env: Env) -> None:
    env.kube.sar_calls.clear()
    denied: set[str] = set()

    def policy(spec: dict[str, object]) -> bool:
        attrs = spec["resourceAttributes"]
        assert isinstance(attrs, dict)
        return attrs["namespace"] not in denied

    env.kube.sar_policy = policy
    await env.get("/namespaces/ns1/podimagepulls")
    await env.get("/podimagepulls?watch=true&timeoutSeconds=1")
    await env.get("/nodeimagepulls/node-a")
    attrs = [c["spec"]["resourceAttributes"] for c in env.kube.sar_calls]
    assert [(a["verb"], a["resource"], a["namespace"], a["name"]) for a in attrs] == [
        ("list", "podimagepulls", "ns1", ""), ("watch", "podimagepulls", "", ""),
        ("get", "nodeimagepulls", "", "node-a")]
    denied.add("ns2")
    code, body = await env.get("/namespaces/ns2/podimagepulls", token="bob-token")
    assert code == 403 and 'cannot list resource "podimagepulls"' in body["message"]


async def test_watches_follow_namespaces_not_pods(env: Env,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listbody, "INLINE", 10)  # this list is encoded in a thread
    for i in range(60):
        env.kube.put("api/v1", "pods", pod(f"p{i}", node=f"node-{i % 3}"))
    env.agent.views.update({f"node-{i}": node_view() for i in range(3)})
    code, body = await env.get("/namespaces/ns1/podimagepulls")
    assert code == 200 and len(body["items"]) == 60
    # 60 pods followed: one pod watch and one event watch, one poll per node.
    assert env.kube.watching("pods") == 1 and env.kube.watching("events") == 1
    assert env.feeds.watches() == 2 and env.feeds.agent_polls() == 3


async def test_one_poll_per_node_whatever_the_feeds(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a", node="node-a"))
    env.kube.put("api/v1", "pods", pod("b", namespace="ns2", node="node-a"))
    env.agent.views["node-a"] = node_view(pull("registry.test/app", progress=5, total=10,
                                               rate=1.0))
    _, ns1 = await env.get("/namespaces/ns1/podimagepulls")
    _, every = await env.get("/podimagepulls")
    _, nodes = await env.get("/nodeimagepulls")
    # three feeds (ns1, all namespaces, nodes) read node-a through one poll
    assert env.feeds.agent_polls() == 1
    assert len(every["items"]) == 2 and nodes["items"][0]["status"]["pulling"] == 1
    assert ns1["items"][0]["status"]["images"][0]["progress"] == 5
    # the all-namespaces feed is shared by podimagepulls -A and nodeimagepulls
    assert env.feeds.watches() == 4


async def test_a_namespace_is_served_from_the_running_cluster_wide_feed(env: Env) -> None:
    env.kube.put("api/v1", "pods", pod("a", labels={"app": "web"}))
    env.kube.put("api/v1", "pods", pod("b", namespace="ns2", labels={"app": "web"}))
    _, every = await env.get("/podimagepulls")
    assert len(every["items"]) == 2
    # While the all-namespaces feed lingers, a namespace needs no watches of its own,
    # and still sees only its pods (by list, selector and watch).
    code, ns2 = await env.get("/namespaces/ns2/podimagepulls?labelSelector=app%3Dweb")
    assert code == 200 and [i["metadata"]["name"] for i in ns2["items"]] == ["b"]
    code, one = await env.get("/namespaces/ns1/podimagepulls/b")
    assert code == 404, one
    assert env.kube.watching("pods") == 1 and env.kube.watching("events") == 1
    assert list(env.feeds.pods.parts()) == [""]


async def test_only_a_feeds_first_list_waits_for_the_nodes_first_views(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(feeds, "FIRST_VIEWS", 3600.0)
    env.kube.put("api/v1", "pods", pod("a", node="node-a"))
    env.agent.views["node-a"] = node_view(pull("registry.test/app", progress=5, total=10))
    _, first = await env.get("/namespaces/ns1/podimagepulls")
    assert first["items"][0]["status"]["images"][0]["progress"] == 5  # it waited for it
    # A rollout reaches a node whose agent has not answered yet: the next list shows
    # kubelet's view of that pod at once, not after FIRST_VIEWS.
    env.agent.stalled.add("node-b")
    env.kube.put("api/v1", "pods", pod("b", node="node-b"))
    await until(lambda: env.agent.reads.get("node-b"))  # the feed polls node-b now
    code, body = await asyncio.wait_for(env.get("/namespaces/ns1/podimagepulls"), 10)
    assert code == 200 and sorted(i["metadata"]["name"] for i in body["items"]) == ["a", "b"]


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the pods the feeds build an object for, in order."""
    names: list[str] = []
    real = feeds.pod_image_pull

    def counting(pod: Any, events: Any, view: Any, previous: Any = None) -> dict[str, Any]:
        names.append(pod["metadata"]["name"])
        return real(pod, events, view, previous)

    monkeypatch.setattr(feeds, "pod_image_pull", counting)
    return names


async def _until_status(env: Env, name: str, key: str, value: object) -> None:
    """Until ``name``'s object in ns1 shows ``status[key] == value``."""
    async def shown() -> bool:
        _, body = await env.get(f"/namespaces/ns1/podimagepulls/{name}")
        return bool(body["status"][key] == value)
    await until(shown)


async def test_a_view_change_rebuilds_only_the_pods_whose_pull_moved(
        env: Env, built: list[str]) -> None:
    for name in ("a", "b"):
        p = env.kube.put("api/v1", "pods", pod(name, f"registry.test/{name}:1"))
        env.kube.put("api/v1", "events",
                     event(p, "Pulling", f'Pulling image "registry.test/{name}:1"'))
    env.agent.views["node-a"] = node_view(
        pull("registry.test/a", progress=1, total=10, rate=1.0),
        pull("registry.test/b", progress=1, total=10, rate=1.0))
    _, first = await env.get("/namespaces/ns1/podimagepulls")
    assert {i["metadata"]["name"]: i["status"]["progress"] for i in first["items"]} == \
        {"a": 1, "b": 1}
    built.clear()
    # Only a's bytes move: b's object cannot change, and is not rebuilt.
    env.agent.views["node-a"] = node_view(
        pull("registry.test/a", progress=7, total=10, rate=1.0),
        pull("registry.test/b", progress=1, total=10, rate=1.0))

    await _until_status(env, "a", "progress", 7)
    assert built and set(built) == {"a"}, built


async def test_a_pull_starting_on_a_node_rebuilds_no_pod_kubelet_has_not_asked_for(
        env: Env, built: list[str]) -> None:
    """A rollout on a node of ten pods: each pull starting or ending moved the node's
    pulls and slot counts, and rebuilt all ten (issue 36: most of the leader's
    rebuilds in the replay). Now only the pods that read them: those kubelet pulls."""
    a = env.kube.put("api/v1", "pods", pod("a", "registry.test/a:1"))
    env.kube.put("api/v1", "events", event(a, "Pulling", 'Pulling image "registry.test/a:1"'))
    for name in ("b", "c", "d"):
        env.kube.put("api/v1", "pods", pod(name, f"registry.test/{name}:1"))
    env.agent.views["node-a"] = node_view(pull("registry.test/a", progress=1, total=10,
                                               rate=1.0))
    await env.get("/namespaces/ns1/podimagepulls")
    b = env.kube.get("api/v1", "pods", "ns1", "b")
    assert b is not None
    env.kube.put("api/v1", "events", event(b, "Pulling", 'Pulling image "registry.test/b:1"'))

    await _until_status(env, "b", "phase", "Pulling")
    built.clear()
    env.agent.views["node-a"] = node_view(
        pull("registry.test/a", progress=1, total=10, rate=1.0),
        pull("registry.test/b", progress=2, total=10, rate=1.0))

    await _until_status(env, "b", "progress", 2)
    assert set(built) == {"b"}, built  # not c and d (nor a: its own pull stood still)


async def test_a_big_change_is_rebuilt_a_batch_per_turn_of_the_loop(
        env: Env, built: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(10):
        env.kube.put("api/v1", "pods", pod(f"p{i}"))
    async with env.feeds.pods.use("ns1") as feed:
        await feed.ready()
        built.clear()
        monkeypatch.setattr(feeds, "FLUSH_BATCH", 3)
        feed.mark(None)  # as after a relist: every pod
        feed.cancel()
        feed._fire()
        assert len(built) == 3 and len(feed.dirty) == 7  # the rest on later turns
        await until(lambda: not feed.dirty and len(built) == 10)
        await feed.ready()
        assert len(feed.collection.objects) == 10


async def test_the_first_build_is_a_batch_per_turn_of_the_loop(
        env: Env, built: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """50,000 pods built in one go held the replica's loop (requests, watches, the
    Lease's renewal) for seconds."""
    for i in range(10):
        env.kube.put("api/v1", "pods", pod(f"p{i}"))
    monkeypatch.setattr(feeds, "FLUSH_BATCH", 3)
    seen: list[int] = []
    async with env.feeds.pods.use("ns1") as feed:
        async def look() -> None:  # what another task sees between turns of the loop
            while not feed.synced.is_set():
                seen.append(len(built))
                await asyncio.sleep(0)
        looking = asyncio.create_task(look())
        await feed.ready()
        await looking
        assert len(feed.collection.objects) == 10
    assert any(0 < n < 10 for n in seen), sorted(set(seen))


class _Walked(dict[str, Any]):
    """A dict that counts walks over it (each of 5,000 nodes, at every flush)."""
    walks = 0

    def items(self) -> Any:
        _Walked.walks += 1
        return super().items()

    def __iter__(self) -> Any:
        _Walked.walks += 1
        return super().__iter__()


async def test_a_change_looks_at_its_own_pods_nodes_only(
        env: Env, built: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(6):
        p = env.kube.put("api/v1", "pods", pod(f"p{i}", f"registry.test/p{i}:1",
                                               node=f"node-{i % 3}"))
        env.kube.put("api/v1", "events", event(p, "Pulling", 'Pulling image "x"'))
    async with env.feeds.pods.use("ns1") as feed:
        await feed.ready()
        assert set(feed._needs) == {"node-0", "node-1", "node-2"}
        monkeypatch.setattr(feed, "_needs", _Walked(feed._needs))
        monkeypatch.setattr(feed, "on_node", _Walked(feed.on_node))
        _Walked.walks = 0
        built.clear()
        env.kube.put("api/v1", "pods", pod("p0", "registry.test/p0:1", node="node-0",
                                           labels={"v": "2"}))
        await until(lambda: "p0" in built and not feed.dirty)
        assert _Walked.walks == 0


async def test_a_list_of_thousands_is_streamed_and_whole(env: Env) -> None:
    """Past a slice (500 objects) the list is streamed in slices, plain and as a
    Table, and holds every object: the same as the same list in pages."""
    n = 1203
    for i in range(n):
        env.kube.put("api/v1", "pods", pod(f"p{i:04d}"))
    code, whole = await env.get("/namespaces/ns1/podimagepulls")
    assert code == 200
    names = [o["metadata"]["name"] for o in whole["items"]]
    assert names == [f"p{i:04d}" for i in range(n)]
    assert whole["metadata"]["resourceVersion"]
    code, rows = await env.get("/namespaces/ns1/podimagepulls", accept=TABLE)
    assert code == 200 and rows["kind"] == "Table" and rows["columnDefinitions"]
    assert [r["cells"][0] for r in rows["rows"]] == names
    paged, cont = [], ""
    while True:
        code, page = await env.get("/namespaces/ns1/podimagepulls?limit=500"
                                   + (f"&continue={cont}" if cont else ""))
        assert code == 200
        paged += [o["metadata"]["name"] for o in page["items"]]
        cont = page["metadata"].get("continue", "")
        if not cont:
            break
    assert paged == names
