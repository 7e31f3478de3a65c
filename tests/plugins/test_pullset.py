"""image-pull-progress over many pods: targets, selectors, the state of each pod from its
PodImagePull, stuck-first order, the header and the cut to the terminal."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from aggapi.client.errors import ClientError
from aggapi.plugins.collection import Change, collection_path, selector_params
from aggapi.plugins.pullset import (
    DONE,
    PULLING,
    STALL_SECONDS,
    STUCK,
    WAITING,
    PullSet,
    pod_row,
    sort_rows,
)
from aggapi.plugins.setview import PlainSetView, RichSetView, header_lines, set_screen
from aggapi.plugins.targets import Target, parse_target, selector_string
from tests.plugins.fakecollection import pod_image_pull


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


def test_collection_request_per_mode() -> None:
    """Namespaced or all namespaces; -l as labelSelector, --node as spec.nodeName."""
    t = parse_target(None, selector="app=web", node=None, all_namespaces=False)
    assert collection_path(t, "shop") == \
        "/apis/subresources.aggapi.io/v1alpha1/namespaces/shop/podimagepulls"
    assert selector_params(t) == [("labelSelector", "app=web")]
    t = parse_target(None, selector=None, node="n1", all_namespaces=True)
    assert collection_path(t, "shop") == "/apis/subresources.aggapi.io/v1alpha1/podimagepulls"
    assert selector_params(t) == [("fieldSelector", "spec.nodeName=n1")]


PHASES = ["Failed", "BackOff", "Waiting", "Downloading", "Extracting", "Resolving", "Pulling",
          "Pending", "Done", "AlreadyPresent"]


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.sampled_from(PHASES), st.none() | st.floats(0, 1e4),
                          st.floats(0, 100), st.sampled_from(["n1", "n2", "n3"])),
                max_size=30))
def test_rows_stuck_then_waiting_then_pulling_by_eta_then_done(
        pods: list[tuple[str, float | None, float, str]]) -> None:
    now = 100.0
    rows = []
    for i, (phase, eta, moved, node) in enumerate(pods):
        row = pod_row(pod_image_pull("ns", f"p{i:02d}", node=node, phase=phase, eta=eta,
                                     rate=None if eta is None else 1.0), None, moved)
        row.eta = eta if phase not in ("Done", "AlreadyPresent") else None
        rows.append(row)
    out = sort_rows(rows, now)
    states = [r.state(now) for r in out]
    assert states == sorted(states)
    for r in out:
        stalled = r.images[0].phase == "Downloading" and now - r.moved_at >= STALL_SECONDS
        phase = r.images[0].phase
        want = (DONE if phase in ("Done", "AlreadyPresent") else
                STUCK if phase in ("Failed", "BackOff") or stalled else
                WAITING if phase == "Waiting" else PULLING)
        assert r.state(now) == want, (phase, r.moved_at)
    pulling = [r.eta for r in out if r.state(now) == PULLING]
    known = [e for e in pulling if e is not None]
    assert known == sorted(known, reverse=True)
    assert pulling == known + [None] * (len(pulling) - len(known))  # unknown ETA last


def mixed_set() -> tuple[PullSet, list[float]]:
    """2 stuck (BackOff, stalled), 1 waiting, 3 pulling (ETA 30, 300, unknown), 2 done."""
    t = [0.0]
    ps = PullSet(clock=lambda: t[0])
    objs = [pod_image_pull("ns", "backoff", node="n1", phase="BackOff", progress=None,
                           total=None, rate=None, reason="ImagePullBackOff: not found"),
            pod_image_pull("ns", "stalled", node="n2", progress=10, total=100, rate=1.0),
            pod_image_pull("ns", "waiting", node="n1", phase="Waiting", progress=None,
                           total=None, rate=None),
            pod_image_pull("ns", "slow", node="n3", progress=0, total=300, rate=1.0),
            pod_image_pull("ns", "fast", node="n1", progress=70, total=100, rate=1.0),
            pod_image_pull("ns", "pulling", node="n2", phase="Pulling", progress=None,
                           total=None, rate=None),
            pod_image_pull("ns", "done-a", node="n1", phase="Done"),
            pod_image_pull("ns", "done-b", node="n3", phase="AlreadyPresent")]
    ps.apply(Change("LIST", items=tuple(objs)))
    t[0] = STALL_SECONDS + 1
    # Every pod but "stalled" moved since: new bytes, or (done, waiting) the same state
    # re-sent with fresh bytes elsewhere.
    for o in objs:
        if o["metadata"]["name"] == "slow":
            o["status"]["images"][0]["progress"] = 1
            o["status"]["etaSeconds"] = 299.0
        if o["metadata"]["name"] == "fast":
            o["status"]["images"][0]["progress"] = 71
        if o["metadata"]["name"] in ("slow", "fast"):
            ps.apply(Change("MODIFIED", o))
    return ps, t


def test_header_counts_and_slowest_nodes() -> None:
    ps, _ = mixed_set()
    s = ps.summary()
    assert s.pods == 8
    assert s.counts == {STUCK: 2, WAITING: 1, PULLING: 3, DONE: 2}
    # by the longest ETA of a pod not done: n3 299 s, n2 90 s (stalled), n1 30 s
    assert [(n.node, n.eta) for n in s.slowest] == [("n3", 299.0), ("n2", 90.0),
                                                    ("n1", 30.0)]
    assert s.slowest[0].eta == 299.0 and s.slowest[0].pulling == 1
    head = header_lines(s)
    assert head[0] == ("8 pods: 2 done, 3 pulling, 1 waiting for a slot, "
                       "2 stuck (BackOff/Failed/stalled)")
    assert head[1] == ("slowest nodes: n3 ETA 0:04:59 at 1 B/s (1 pods), "
                       "n2 ETA 0:01:30 at 1 B/s (2 pods), n1 ETA 0:00:30 at 1 B/s (3 pods)")
    assert ps.failures() == ["ns/backoff: app: ImagePullBackOff: not found"]
    assert not ps.finished()


def test_rows_in_order_and_cut_to_the_terminal() -> None:
    ps, _ = mixed_set()
    assert [r.name.split("/")[1] for r in ps.rows()] == [
        "backoff", "stalled", "waiting", "slow", "fast", "pulling", "done-a", "done-b"]
    for height, shown in ((9, 5), (40, 8)):
        con = Console(file=io.StringIO(), width=200, height=height, record=True)
        view = RichSetView(ps, console=con)
        view.close()
        text = con.export_text()
        lines = [ln for ln in text.splitlines() if ln.startswith("ns/")]
        # the last frame drawn: the rows of the final redraw
        last = lines[-shown:]
        assert [ln.split()[0] for ln in last] == [
            f"ns/{n}" for n in ("backoff", "stalled", "waiting", "slow", "fast", "pulling",
                                "done-a", "done-b")[:shown]], text
        more = len(ps.rows()) - shown
        assert (f"… and {more} more" in text) == (more > 0), text
    assert "BackOff: app: ImagePullBackOff: not found" in text
    assert "Stalled" in text
    con = Console(file=io.StringIO(), width=200, height=40, record=True)
    con.print(set_screen(ps, 2))
    text = con.export_text()
    assert "… and 6 more" in text and "ns/waiting" not in text


def test_max_rows_overrides_the_terminal() -> None:
    ps, _ = mixed_set()
    con = Console(file=io.StringIO(), width=200, height=40, record=True)
    RichSetView(ps, max_rows=3, console=con).close()
    assert "… and 5 more" in con.export_text()


def test_server_text_is_cleaned() -> None:
    ps = PullSet()
    evil = pod_image_pull("ns", "p\x1b]52;c;aGk=\x07x", phase="Failed", progress=None,
                          total=None, rate=None, reason="denied\x1b[2J\x9b31m!")
    ps.apply(Change("LIST", items=(evil,)))
    out, err = io.StringIO(), io.StringIO()
    PlainSetView(ps, out, err).close()
    assert out.getvalue() == "ns/px  app  registry.local/app:1  Failed  -  denied!\n"
    assert not any(ord(c) < 32 and c != "\n" for c in out.getvalue() + err.getvalue())


def test_list_replaces_and_changes_apply() -> None:
    ps = PullSet()
    ps.apply(Change("LIST", items=(pod_image_pull("ns", "a"), pod_image_pull("ns", "b"))))
    ps.apply(Change("DELETED", pod_image_pull("ns", "a")))
    ps.apply(Change("ADDED", pod_image_pull("ns", "c", phase="Done")))
    assert sorted(ps.pods) == ["ns/b", "ns/c"]
    ps.apply(Change("LIST", items=(pod_image_pull("ns", "c", phase="Done"),)))  # a relist
    assert sorted(ps.pods) == ["ns/c"] and ps.finished()
    ps.apply(Change("LIST", items=(pod_image_pull("ns", "d", phase="Failed",
                                                  reason="InvalidImageName: bad"),)))
    assert ps.finished() and ps.failures() == ["ns/d: app: InvalidImageName: bad"]


def test_single_pod_flags_are_refused_for_many_pods(capsys: pytest.CaptureFixture[str]) -> None:
    from aggapi.plugins.image_pull_progress import main

    for argv in (["-l", "a=b", "--no-follow"], ["--node", "n1", "-c", "app"],
                 ["web", "-l", "a=b"], [], ["web", "--max-rows", "5"],
                 ["-A", "--max-rows", "0"]):
        assert main(argv) == 2, argv  # a usage error, before any connection
        assert "error:" in capsys.readouterr().err
