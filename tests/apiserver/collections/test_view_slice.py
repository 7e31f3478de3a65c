"""A pod's object is rebuilt on a node view change only when its slice of the view
changed (``view_slice``; the other pulls and the slots only for an object that
``reads_others``). Sound only if the object never differs between two views with the
same slice: checked over random pods, events and pairs of views."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections.podimagepulls import pod_image_pull, reads_others, view_slice
from tests import kubeobjects

from .fakes import event

IMAGES = ["registry.test/a:1", "registry.test/a:2", "registry.test/b:1", "other.test/c:1"]
REPOS = sorted({i.rsplit(":", 1)[0] for i in IMAGES})
PHASES = ["Resolving", "Downloading", "Extracting", "Failed", "Waiting"]

pulls = st.fixed_dictionaries({
    "lease": st.sampled_from(["l1", "l2", "l3"]),
    "phase": st.sampled_from(PHASES),
    "repositories": st.lists(st.sampled_from(REPOS), max_size=2, unique=True),
    "images": st.lists(st.sampled_from(IMAGES), max_size=2, unique=True),
    "progress": st.integers(0, 100), "total": st.integers(0, 100),
    "bytesPerSecond": st.none() | st.floats(0.5, 50),
    "downloadingLayers": st.integers(0, 3)})
views = st.fixed_dictionaries({
    "kind": st.just("NodeImagePulls"),
    "pulls": st.lists(pulls, max_size=3),
    # (mostly full: a pod whose kubelet pulls while others hold every slot waits)
    "slotsFree": st.sampled_from([0, 0, 0, 1, None]),
    "inFlight": st.integers(0, 3),
    "slots": st.fixed_dictionaries({"limit": st.sampled_from([1, 1, 2, None]),
                                    "serialize": st.none(), "source": st.just("test"),
                                    "error": st.just("")}),
    "linkBytesPerSecond": st.none() | st.floats(1, 100),
    "error": st.sampled_from(["", "agent busy"]),
    "time": st.sampled_from(["2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z"])})


@st.composite
def view_pairs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A view and the next one: some pulls' fields moved, some pulls come or go, the
    counts change; often only another pod's bytes."""
    v1: dict[str, Any] = draw(views)
    v2: dict[str, Any] = copy.deepcopy(v1)
    for p in v2["pulls"]:
        for field in draw(st.lists(st.sampled_from(
                ["progress", "total", "bytesPerSecond", "phase", "images"]), max_size=2)):
            p[field] = draw(pulls)[field]
    if draw(st.booleans()):
        v2["pulls"] = v2["pulls"][:draw(st.integers(0, len(v2["pulls"])))] + \
            draw(st.lists(pulls, max_size=1))
    for field in draw(st.lists(st.sampled_from(
            ["slotsFree", "inFlight", "linkBytesPerSecond", "error", "time"]), max_size=2)):
        v2[field] = draw(views)[field]
    return v1, v2


@settings(derandomize=True, max_examples=400, deadline=None)
@given(images=st.lists(st.sampled_from(IMAGES), min_size=1, max_size=2),
       kubelet=st.lists(st.sampled_from(["", "Pulling", "Pulling", "Pulled"]), min_size=2,
                        max_size=2),
       pair=view_pairs())
def test_same_slice_same_object(images: list[str], kubelet: list[str],
                                pair: tuple[dict[str, Any], dict[str, Any]]) -> None:
    pod = kubeobjects.pod_object("p", [(f"c{i}", img) for i, img in enumerate(images)],
                                 node="node-a", namespace="ns1", uid="uid-p")
    events = []
    for i, (img, reason) in enumerate(zip(images, kubelet, strict=False)):
        if reason:
            ev = event(pod, reason, f'{reason} image "{img}"', n=i)
            ev["involvedObject"]["fieldPath"] = f"spec.containers{{c{i}}}"
            events.append(ev)
    v1, v2 = pair
    built = pod_image_pull(pod, events, v1)
    if view_slice(images, v1) == view_slice(images, v2):
        assert built == pod_image_pull(pod, events, v2)
    others = reads_others(built)
    if view_slice(images, v1, others=others) == view_slice(images, v2, others=others):
        assert built == pod_image_pull(pod, events, v2)


def test_a_pod_kubelet_has_not_asked_for_ignores_the_others() -> None:
    """The narrowed slice: a pull of another image starting on the node (the pulls, the
    counts and the slots all move) leaves a pod kubelet has not asked for as it was,
    and is read by one that waits for a slot."""
    img = "registry.test/a:1"
    pod = kubeobjects.pod_object("p", [("c0", img)], node="node-a", namespace="ns1",
                                 uid="uid-p")
    slots = {"limit": 1, "serialize": None, "source": "test", "error": ""}
    idle = {"kind": "NodeImagePulls", "pulls": [], "slotsFree": 1, "inFlight": 0,
            "slots": slots}
    busy = {**idle, "slotsFree": 0, "inFlight": 1, "pulls": [{
        "lease": "l1", "phase": "Downloading", "images": ["other.test/c:1"],
        "repositories": ["other.test/c"], "progress": 5, "total": 10}]}
    pending = pod_image_pull(pod, [], idle)
    assert not reads_others(pending)
    assert view_slice([img], idle, others=False) == view_slice([img], busy, others=False)
    assert pod_image_pull(pod, [], busy) == pending
    ev = event(pod, "Pulling", f'Pulling image "{img}"')
    ev["involvedObject"]["fieldPath"] = "spec.containers{c0}"
    asked = pod_image_pull(pod, [ev], idle)
    assert reads_others(asked)
    assert view_slice([img], idle) != view_slice([img], busy)
    assert pod_image_pull(pod, [ev], busy)["status"]["images"][0]["phase"] == "Waiting"
