"""image-pull-progress over many pods: targets, selectors, stuck-first order, the runner."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.client.errors import ClientError
from aggapi.plugins import pullset
from aggapi.plugins.pullset import STALL_SECONDS, PullSet, Row, Runner, sort_rows
from aggapi.plugins.targets import Target, parse_target, selector_string

IMG = "registry.local/app:1"


def test_targets() -> None:
    assert parse_target("web", selector=None, node=None, all_namespaces=False) == \
        Target(pod="web")
    assert parse_target("pod/web", selector=None, node=None, all_namespaces=False).pod == "web"
    for kind in ("deployment", "deploy", "statefulset", "daemonset", "replicaset", "job"):
        t = parse_target(f"{kind}/web", selector=None, node=None, all_namespaces=False)
        assert t.workload is not None and t.workload[1] == "web" and not t.single
    t = parse_target(None, selector="app=web", node="n1", all_namespaces=True)
    assert (t.label_selector, t.field_selector, t.all_namespaces) == \
        ("app=web", "spec.nodeName=n1", True)
    for bad in (("service/web", None, None), ("deployment/", None, None),
                ("web", "a=b", None), ("web", None, "n1"), (None, None, None)):
        with pytest.raises(ClientError):
            parse_target(bad[0], selector=bad[1], node=bad[2], all_namespaces=False)


def test_selector_string() -> None:
    sel = {"matchLabels": {"b": "2", "a": "1"},
           "matchExpressions": [{"key": "tier", "operator": "In", "values": ["x", "y"]},
                                {"key": "env", "operator": "NotIn", "values": ["dev"]},
                                {"key": "has", "operator": "Exists"},
                                {"key": "not", "operator": "DoesNotExist"}]}
    assert selector_string(sel) == "a=1,b=2,tier in (x,y),env notin (dev),has,!not"
    with pytest.raises(ClientError):
        selector_string({"matchExpressions": [{"key": "k", "operator": "Near"}]})


PHASES = ["Failed", "BackOff", "Waiting", "Downloading", "Extracting", "Resolving", "Done",
          "AlreadyPresent", "Pending", "Queued"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(PHASES), st.floats(0, 100)), max_size=20))
def test_stuck_pulls_sort_first(rows: list[tuple[str, float]]) -> None:
    now = 100.0
    objs = [Row(f"ns/p{i}", "c", IMG, phase=ph, moved_at=m) for i, (ph, m) in enumerate(rows)]
    out = sort_rows(objs, now)
    ranks = [r.rank(now) for r in out]
    assert ranks == sorted(ranks)
    for r in out:
        stalled = r.phase == "Downloading" and now - r.moved_at >= STALL_SECONDS
        stuck = r.phase in ("Failed", "BackOff", "Waiting") or stalled
        done = r.phase in ("Done", "AlreadyPresent")
        assert r.rank(now) == (0 if stuck else 2 if done else 1)
        assert (r.state(now) == "Stalled") == stalled


def prog(n: int, phase: str = "Downloading") -> dict[str, Any]:
    return {"kind": "Progress", "container": "c", "image": IMG, "layer": "", "progress": n,
            "total": 100, "phase": phase, "bytesPerSecond": 10.0, "etaSeconds": 1.0}


def summary(phase: str = "Done") -> dict[str, Any]:
    return {"kind": "Summary", "phase": phase, "images": [
        {"container": "c", "image": IMG, "phase": phase}]}


def pod(name: str, node: str | None = "n1", waiting: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {}
    if waiting:
        status["containerStatuses"] = [{"name": "c", "image": IMG,
                                        "state": {"waiting": {"reason": waiting}}}]
    return {"metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": IMG}]},
            "status": status}


def test_pullset_stall_backoff_and_finish() -> None:
    t = [0.0]
    ps = PullSet(clock=lambda: t[0])
    a = ps.pod_seen("ns/a", pod("a"))
    b = ps.pod_seen("ns/b", pod("b", waiting="ImagePullBackOff"))
    ps.pod_seen("ns/c", pod("c", node=None))
    assert ps.pods["ns/c"].rows[("c", IMG)].phase == "Unscheduled"
    ps.progress(a, prog(10))
    t[0] = STALL_SECONDS + 1
    assert [r.pod for r in ps.rows()][:2] == ["ns/a", "ns/b"]  # stalled and BackOff first
    assert ps.rows()[0].state(t[0]) == "Stalled"
    ps.progress(a, prog(20))  # bytes moved again
    assert ps.rows()[0].pod == "ns/b"
    assert ps.failures() == ["ns/b c: ImagePullBackOff"]
    ps.progress(a, summary())
    assert a.done and not ps.finished()
    ps.progress(b, {"kind": "Error", "container": "c", "error": "manifest unknown"})
    del ps.pods["ns/c"]
    assert ps.finished() and ps.failures() == ["ns/b: manifest unknown"]
    assert ps.pods["ns/a"].rows[("c", IMG)].progress == 100


class Script:
    """Stands in for the pod watch and the per-pod progress streams."""

    def __init__(self, pods: list[dict[str, Any]], streams: dict[str, list[Any]]) -> None:
        self.pods, self.streams = pods, streams
        self.open = 0
        self.most_open = 0
        self.more = asyncio.Event()

    async def follow(self, conn: Any, target: Any, ns: str) -> AsyncIterator[tuple[str, Any]]:
        for p in self.pods:
            yield "ADDED", p
        await self.more.wait()
        yield "ADDED", pod("late")
        await asyncio.Event().wait()

    async def watch(self, conn: Any, name: str, **kw: Any) -> AsyncIterator[dict[str, Any]]:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            objs = self.streams.get(name, [prog(50), summary()])
            for o in objs:
                await asyncio.sleep(0)
                yield o
            self.more.set()
            if objs[-1]["kind"] == "Progress":  # a pull still going: the stream stays open
                await asyncio.Event().wait()
        finally:
            self.open -= 1


async def run(monkeypatch: pytest.MonkeyPatch, script: Script, *, fail_fast: bool = False,
              max_streams: int = 50) -> tuple[list[str], Runner]:
    monkeypatch.setattr(pullset, "follow_pods", script.follow)
    monkeypatch.setattr(pullset, "watch_progress", script.watch)
    r = Runner(Any, Target(label_selector="app=web"), "ns",  # type: ignore[arg-type]
               fail_fast=fail_fast, redraw=lambda: None, max_streams=max_streams)
    return await asyncio.wait_for(r.run(), 10), r


async def test_runner_follows_pods_that_appear_and_bounds_streams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    script = Script([pod(f"p{i}") for i in range(7)], {})
    failures, r = await run(monkeypatch, script, max_streams=3)
    assert failures == []
    assert script.most_open == 3
    assert all(p.done for p in r.set.pods.values()) and len(r.set.pods) == 8
    assert "ns/late" in r.set.pods  # appeared after the start


async def test_runner_without_fail_fast_waits_for_all_then_fails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    err = {"kind": "Error", "container": "c", "error": "denied"}
    script = Script([pod("p0"), pod("p1")], {"p0": [err]})
    failures, r = await run(monkeypatch, script)
    assert failures == ["ns/p0: denied"] and r.set.pods["ns/p1"].done


async def test_fail_fast_stops_at_the_first_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    never: list[Any] = [prog(1)]  # a pull that keeps going
    script = Script([pod("p0"), pod("p1", waiting="ErrImagePull")], {"p0": never, "p1": never})
    failures, r = await run(monkeypatch, script, fail_fast=True)
    assert failures == ["ns/p1 c: ErrImagePull"]
    assert not r.set.pods["ns/p0"].done


def test_plain_and_table_views_show_stuck_rows_first() -> None:
    import io

    from rich.console import Console

    from aggapi.plugins.render import PlainSetView, set_table

    t = [100.0]
    ps = PullSet(clock=lambda: t[0])
    ps.progress(ps.pod_seen("ns/a", pod("a")), summary())
    b = ps.pod_seen("ns/b", pod("b", waiting="ImagePullBackOff"))
    ps.progress(ps.pod_seen("ns/c", pod("c")), prog(40))
    assert b.rows[("c", IMG)].state(t[0]) == "BackOff"
    con = Console(file=io.StringIO(), width=160, record=True)
    con.print(set_table(ps.rows(), t[0]))
    lines = [ln for ln in con.export_text().splitlines() if ln.startswith("ns/")]
    assert [ln.split()[0] for ln in lines] == ["ns/b", "ns/c", "ns/a"]
    assert "BackOff: ImagePullBackOff" in lines[0] and "Done" in lines[2]
    out = io.StringIO()
    PlainSetView(ps.rows, lambda: t[0], out).redraw()
    assert out.getvalue().splitlines()[0].startswith(f"ns/b  c  {IMG}  BackOff")


def test_single_pod_flags_are_refused_for_many_pods(capsys: pytest.CaptureFixture[str]) -> None:
    from aggapi.plugins.image_pull_progress import main

    for argv in (["deployment/web", "-o", "json"], ["-l", "a=b", "--no-follow"],
                 ["--node", "n1", "-c", "app"], ["web", "-l", "a=b"], []):
        assert main(argv) == 2, argv  # a usage error, before any connection
        assert "error:" in capsys.readouterr().err
