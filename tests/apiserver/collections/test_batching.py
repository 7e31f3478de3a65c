"""The feed's rebuild order: kube's changes (phases, new and gone pods) before the
bytes of the nodes' views, whatever number of pods wait for new bytes."""

from __future__ import annotations

import pytest

from aggapi.apiserver.collections import batcher
from tests.framework.until import until

from .conftest import Env
from .fakes import pod

N = 1000


async def test_a_kube_change_is_rebuilt_before_a_thousand_waiting_for_bytes(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher, "FLUSH_DELAY", 3600.0)  # flushed by hand below
    for i in range(N):
        env.kube.put("api/v1", "pods", pod(f"p{i:04d}"))
    code, body = await env.get("/namespaces/ns1/podimagepulls")
    assert code == 200 and len(body["items"]) == N
    feed = env.feeds.pods.get("ns1")
    assert feed is not None
    # A rollout: every pod's node view moved (their bytes), waiting for a rebuild...
    feed.mark(list(feed.collection.objects))
    # ...when kubelet's view of one changes (here its image).
    key = ("ns1", "p0500")
    env.kube.put("api/v1", "pods", pod("p0500", image="registry.test/app:2"))
    await until(lambda: (feed.source.pod(key) or {})["spec"]["containers"][0]["image"]
                == "registry.test/app:2")
    feed.flush(1)  # one pod's rebuild: the kube change's
    obj = feed.collection.objects[key]
    assert obj["status"]["images"][0]["image"] == "registry.test/app:2"


async def test_the_first_build_is_not_weighed_into_the_history(env: Env) -> None:
    for i in range(50):
        env.kube.put("api/v1", "pods", pod(f"p{i:02d}"))
    code, body = await env.get("/namespaces/ns1/podimagepulls")
    assert code == 200 and len(body["items"]) == 50
    feed = env.feeds.pods.get("ns1")
    assert feed is not None
    col = feed.collection
    # Built before anyone could hold a version of it: no version from before the build
    # is served, and nothing of it is kept (a JSON encode of each object saved).
    assert col.start_rv == col.rv and not col.owns(col.rv - 1) and col.since(col.rv) == []
    assert not list(col._history)
    built = col.rv
    env.kube.put("api/v1", "pods", pod("p07", image="registry.test/app:2"))
    await until(lambda: col.rv > built)
    assert [ev.key for ev in col.since(built)] == [("ns1", "p07")]
