"""imagepullprogress streaming: /watch/ path, resume after a cut or a clean end."""

from __future__ import annotations

from typing import Any

import pytest

from aggapi.client import errors
from aggapi.client.connection import Connection
from aggapi.client.progress import all_present, watch_progress
from aggapi.client.retry import Backoff
from tests.client.fakeserver import FakeCluster, Session

IMG = "registry.local/app:1"


def prog(n: int, total: int = 1000, phase: str = "Downloading") -> dict[str, Any]:
    return {"kind": "Progress", "image": IMG, "layer": "sha256:aa", "progress": n,
            "total": total, "error": "", "container": "app", "phase": phase,
            "bytesPerSecond": 100.0, "etaSeconds": (total - n) / 100, "time": "t"}


SUMMARY = {"kind": "Summary", "phase": "Done", "progress": 1000, "total": 1000,
           "images": [{"container": "app", "image": IMG, "phase": "Done"}], "time": "t"}


async def collect(c: Connection, **kw: Any) -> list[dict[str, Any]]:
    return [o async for o in watch_progress(c, "web", **kw)]


async def test_resumes_after_cut_and_clean_end(cluster: FakeCluster) -> None:
    cluster.sessions = [
        Session([prog(100), prog(300)], end="cut"),
        Session([prog(600)], end="clean"),
        Session([prog(1000, phase="Done"), SUMMARY]),
    ]
    retries: list[str] = []
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        got = await collect(c, containers=["app"], granularity="layer",
                            backoff=Backoff(first=0.01),
                            on_retry=lambda e, d: retries.append(type(e).__name__))
    assert [o.get("progress") for o in got] == [100, 300, 600, 1000, 1000]
    assert got[-1]["kind"] == "Summary" and all_present(got[-1])
    assert len(retries) == 2
    reqs = [r for r in cluster.requests if r["path"].endswith("/imagepullprogress")]
    assert len(reqs) == 3
    for r in reqs:
        assert "/v1alpha1/watch/namespaces/default/pods/web/" in r["path"]
        assert ("container", "app") in r["query"] and ("follow", "true") in r["query"]


async def test_timeout_object_moves_to_resume_path(cluster: FakeCluster) -> None:
    path = "/apis/subresources.aggapi.io/v1alpha1/watch/namespaces/default/pods/web/" \
           "imagepullprogress"
    cluster.sessions = [Session([prog(5), {"kind": "Timeout", "message": "m", "resume": path}]),
                        Session([SUMMARY])]
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        got = await collect(c, backoff=Backoff(attempts=0))
    assert [o["kind"] for o in got] == ["Progress", "Summary"]


async def test_error_object_ends_the_stream(cluster: FakeCluster) -> None:
    err = {"kind": "Error", "image": IMG, "container": "app", "phase": "Failed",
           "error": "ErrImagePull: not found", "time": "t"}
    cluster.sessions = [Session([prog(1), err, prog(2)])]
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        got = await collect(c)
    assert got[-1] == err and len(got) == 2


async def test_gives_up_after_repeated_empty_cuts(cluster: FakeCluster) -> None:
    cluster.sessions = [Session([], end="cut")]
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.TransferError, match="connection to the API server"):
            await collect(c, backoff=Backoff(attempts=2, first=0.01))
    assert len([r for r in cluster.requests if r["path"].endswith("progress")]) == 3


async def test_snapshot_without_follow_ends_cleanly(cluster: FakeCluster) -> None:
    cluster.sessions = [Session([prog(1), prog(2)])]
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        got = await collect(c, follow=False)
    assert len(got) == 2
    assert ("follow", "false") in cluster.requests[-1]["query"]


async def test_refusals_are_not_retried(cluster: FakeCluster) -> None:
    cluster.sessions = [Session([SUMMARY])]
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.BadRequest, match='container "db" is not in pod'):
            await collect(c, containers=["db"])
        with pytest.raises(errors.NotFound):
            async for _ in watch_progress(c, "ghost"):
                pass
    assert len(cluster.requests) == 2
