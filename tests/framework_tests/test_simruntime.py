"""The simulated runtime of the hollow nodes, and the kubelet Events they report.

Properties over random rollouts (derandomized: the draw never decides a CI run): at
most ``slots`` pulls at once, every image pulled in the end (failed first attempts
retried), each byte counter monotone and within its total, plans a pure function of
(seed, image). The hollow kubelet's Events, read by aggapi's own parser, give the
phases kubelet's would.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.imagepullprogress.pullstate import views
from aggapi.auth.capability import ContainerRef
from aggapi.kube.events import from_kubelet
from tests.framework.hollow import Hollow, go_duration, kubelet_events
from tests.framework.simruntime import Profile, Report, SimNode, plan


def _run(node: SimNode, images: list[str], step: float = 0.1, limit: float = 600.0
         ) -> tuple[list[Report], int]:
    t = 0.0
    reports: list[Report] = []
    for i, image in enumerate(images):
        reports += node.request(("ns", f"p{i}", f"uid{i}"), image, t)
    busiest = 0
    last: dict[str, int] = {}
    while t < limit and (node.queue or node.pulling):
        t += step
        reports += node.tick(t)
        busiest = max(busiest, len(node.pulling))
        for p in node.observe(images, t).pulls or ():
            assert p.progress is not None and p.total is not None
            assert 0 <= p.progress <= p.total
            assert p.progress >= last.get(p.lease, 0)
            last[p.lease] = p.progress
    return reports, busiest


@settings(derandomize=True, max_examples=40, deadline=None)
@given(pods=st.integers(1, 12), slots=st.integers(1, 4), seed=st.integers(0, 10**6),
       fail=st.sampled_from([0.0, 0.3, 1.0]))
def test_rollout_on_a_node_ends_with_every_image_present(pods: int, slots: int, seed: int,
                                                         fail: float) -> None:
    profile = Profile(seed=seed, fail_fraction=fail, back_off=0.5)
    node = SimNode("n", profile, slots)
    images = [f"registry.scale.test/rollout/app-{i}:v1" for i in range(pods)]
    reports, busiest = _run(node, images)
    assert busiest <= slots
    assert set(node.present) == set(images)
    done = [r for r in reports if r.kind == "done"]
    assert sorted(r.image for r in done) == sorted(images)
    failed = {r.image for r in reports if r.kind == "failed"}
    assert failed == {i for i in images if plan(i, profile).fail_at is not None}
    for r in done:  # a failed image is pulled again: attempt 2, with a second Pulling
        assert r.attempt == (2 if r.image in failed else 1)
        assert r.size == plan(r.image, profile).total
        assert 0 <= r.waited <= r.seconds


@settings(derandomize=True, max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), image=st.from_regex(r"[a-z]{1,8}/[a-z0-9]{1,8}:v[0-9]",
                                                       fullmatch=True))
def test_plan_is_a_function_of_seed_and_image(seed: int, image: str) -> None:
    p = Profile(seed=seed)
    a, b = plan(f"registry.scale.test/{image}", p), plan(f"registry.scale.test/{image}", p)
    assert a == b
    assert len(a.layers) == p.layers
    for la in a.layers:
        assert p.layer_bytes[0] <= la.size <= p.layer_bytes[1]
        assert p.layer_rate[0] <= la.rate <= p.layer_rate[1]


def test_node_view_names_the_pull_by_repository() -> None:
    """aggapi finds an unwatched image's pull by its repository (distribution-source)."""
    node = SimNode("n", Profile(fail_fraction=0.0), 1)
    node.request(("ns", "p", "u"), "registry.scale.test/rollout/app-1:v1", 0.0)
    node.request(("ns", "q", "v"), "registry.scale.test/rollout/app-2:v1", 0.0)
    node.tick(0.0)
    state = node.observe((), 1.0)
    assert state.pulls is not None and len(state.pulls) == 1
    assert state.pulls[0].repositories == ("registry.scale.test/rollout/app-1",)
    assert state.pulls[0].images == ()
    assert 0 < (state.pulls[0].progress or 0) < (state.pulls[0].total or 0)


def test_go_duration() -> None:
    assert go_duration(0.5) == "500ms"
    assert go_duration(1.25) == "1.25s"
    assert go_duration(75.5) == "1m15.5s"


def _event(h: Hollow, r: Report, kind: str, reason: str, message: str, t: int
           ) -> dict[str, object]:
    ev = h._event(r, "node-1", kind, reason, message)
    ev["lastTimestamp"] = f"2026-01-01T00:00:{t:02d}Z"
    return ev


def test_hollow_kubelet_events_read_as_kubelets() -> None:
    """Pulling, then a failure (BackOff), then Pulling again and Pulled: the phases
    aggapi's parser reads are kubelet's, and only from the pod's node."""
    h = Hollow.__new__(Hollow)
    h._seq = iter(range(100))  # type: ignore[assignment]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "x/y:1"}]}}
    image = "registry.scale.test/x/y:1"
    containers = [ContainerRef("app", image)]
    seen = []
    t = 0
    for report in (Report("pulling", ("ns", "p", "u"), image, 1),
                   Report("failed", ("ns", "p", "u"), image, 1),
                   Report("pulling", ("ns", "p", "u"), image, 2),
                   Report("done", ("ns", "p", "u"), image, 2, seconds=3.5, waited=1.0,
                          size=123)):
        for kind, reason, message in kubelet_events(report):
            t += 1
            ev = _event(h, report, kind, reason, message, t)
            assert from_kubelet(ev, "node-1") and not from_kubelet(ev, "node-2")
            seen.append(ev)
        seen_view = views(pod, seen, containers)[("container", "app")]
        if report.kind == "failed":
            assert seen_view.phase == "BackOff"
            assert "503 Service Unavailable" in seen_view.error
        elif report.kind == "done":
            assert seen_view.phase == "Pulled" and not seen_view.already_present
            assert seen_view.attempt == 2 and seen_view.failures == 1
        else:
            assert seen_view.phase == "Pulling"
    assert "in 2.5s (3.5s including waiting). Image size: 123 bytes." in str(seen[-1]["message"])
