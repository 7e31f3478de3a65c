"""A PodImagePull build that reuses what kube's objects decided (``kubepart``, issue
36) returns exactly what building it whole returns: the first build of a version, its
rebuilds, and the build of every later version of the pod or its events, over random
pods (init containers, image volumes, pull policies, statuses), kubelet's events
(every pull reason, repeats, one second's ties, other nodes' and other pods') and node
views. And what it remembers is bounded, and only objects named by kube-apiserver's
versions are remembered."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi import GROUP_VERSION, imageref
from aggapi.apiserver.collections import kubepart, podimagepulls
from aggapi.apiserver.collections.podimagepulls import pod_image_pull
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.imagepullprogress.objects import overall_phase
from aggapi.apiserver.imagepullprogress.pullstate import (
    K8sView,
    _attempt,
    _counted,
    kubelet_events,
)
from aggapi.apiserver.pods import target_from_pod
from tests.apiserver.podstates import container_states

IMAGES = ["registry.test/a:1", "registry.test/a:2", "busybox", "other.test/c:1",
          "Not/Valid", "registry.test/a@sha256:" + "ab" * 32]
NAMES = ["c0", "c1", "v0"]
TIMES = ["2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "2026-01-01T00:00:01.5Z"]
SECOND_NS = 1767225601 * 10**9  # TIMES[1] in nanoseconds: names client-go gives


def _reference(pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]],
               view: Mapping[str, Any] | None,
               previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``pod_image_pull`` as it was at 313307d, before kubepart: the pod's target and
    the Merger's update built for every build, the sums in comprehensions."""
    target = target_from_pod(pod)
    meta = pod.get("metadata") or {}
    if previous is not None and (previous.get("metadata") or {}).get("uid") != target.uid:
        previous = None
    merger = Merger(target.containers)
    merger.update(pod, kubelet_events(pod, events))
    merger.node_view = dict(view) if view is not None else None
    images = [podimagepulls._image(merger, c, imageref.identity(c.image), bool(target.node),
                                   view, previous) for c in target.containers]
    once = list({podimagepulls._same_image(str(i["image"])): i
                 for i in reversed(images)}.values())
    need = [i for i in once if i["phase"] != "AlreadyPresent"]
    sums = {k: sum(i[k] for i in need) if all(isinstance(i[k], int) for i in need)
            else None for k in ("progress", "total")}
    rates = [i["bytesPerSecond"] for i in need if i["bytesPerSecond"] is not None]
    etas = [i["etaSeconds"] for i in need if i["etaSeconds"] is not None]
    return {
        "apiVersion": GROUP_VERSION, "kind": podimagepulls.KIND,
        "metadata": {"name": target.name, "namespace": target.namespace,
                     "uid": target.uid,
                     **({"creationTimestamp": meta["creationTimestamp"]}
                        if meta.get("creationTimestamp") else {}),
                     "labels": dict(meta.get("labels") or {})},
        "spec": {"nodeName": target.node},
        "status": {"phase": overall_phase([str(i["phase"]) for i in images]),
                   "progress": sums["progress"], "total": sums["total"],
                   "bytesPerSecond": sum(rates) if rates else None,
                   "etaSeconds": max(etas) if etas else None,
                   "imagesPresent": sum(i["phase"] in podimagepulls.PRESENT for i in images),
                   "images": images},
    }


@st.composite
def pods(draw: st.DrawFn, uid: str = "uid-p", rv: str | None = "7") -> dict[str, Any]:
    spec: dict[str, Any] = {}
    statuses: dict[str, list[dict[str, Any]]] = {}
    for key, status in (("initContainers", "initContainerStatuses"),
                        ("containers", "containerStatuses")):
        items = []
        for name in draw(st.lists(st.sampled_from(NAMES[:2]), max_size=2, unique=True)):
            image = draw(st.sampled_from(IMAGES))
            items.append({"name": name, "image": image,
                          "imagePullPolicy": draw(st.sampled_from(["Always", "IfNotPresent"]))})
            state = draw(container_states(TIMES))
            statuses.setdefault(status, []).append({
                "name": name, "state": state,
                "imageID": draw(st.sampled_from(["", "registry.test/a@sha256:" + "cd" * 32]))})
        if items:
            spec[key] = items
    if draw(st.booleans()):
        spec["volumes"] = [{"name": draw(st.sampled_from(NAMES)), "image": {
            "reference": draw(st.sampled_from(IMAGES)),
            "pullPolicy": draw(st.sampled_from(["Always", "IfNotPresent"]))}}]
    node = draw(st.sampled_from(["node-a", "node-a", ""]))
    if node:
        spec["nodeName"] = node
    meta: dict[str, Any] = {"name": "p", "namespace": "ns1", "uid": uid,
                            "labels": {"app": "web"}}
    if rv is not None:
        meta["resourceVersion"] = rv
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": statuses}


@st.composite
def events(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for n in range(draw(st.integers(0, 4))):
        image = draw(st.sampled_from(IMAGES))
        reason, message = draw(st.sampled_from([
            ("Pulling", f'Pulling image "{image}"'),
            ("Pulled", f'Successfully pulled image "{image}" in 1.5s (2s including waiting)'),
            ("Pulled", f'Container image "{image}" already present on machine'),
            ("Failed", f'Failed to pull image "{image}": rpc error: not found'),
            ("Failed", "Error: ErrImagePull"), ("BackOff", f'Back-off pulling image "{image}"'),
            ("Failed", "Error: ImagePullBackOff"), ("Started", "Started container c0")]))
        when = draw(st.sampled_from(TIMES))
        nanos = SECOND_NS + draw(st.integers(0, 10**9 - 1)) if draw(st.booleans()) else n
        out.append({
            "metadata": {"name": f"p.{nanos:x}", "namespace": "ns1",
                         "resourceVersion": str(100 + n)},
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": "ns1",
                               "uid": draw(st.sampled_from(["uid-p", "uid-p", "uid-old"])),
                               "fieldPath": draw(st.sampled_from(
                                   ["spec.containers{c0}", "spec.initContainers{c1}",
                                    "spec.containers{c1}", ""]))},
            "reason": reason, "message": message, "count": draw(st.integers(1, 3)),
            "source": {"component": "kubelet",
                       "host": draw(st.sampled_from(["node-a", "node-a", "node-b"]))},
            "lastTimestamp": when})
    return out


pull = st.fixed_dictionaries({
    "phase": st.sampled_from(["Resolving", "Downloading", "Extracting", "Failed"]),
    "images": st.lists(st.sampled_from(IMAGES[:4]), max_size=2, unique=True),
    "repositories": st.lists(st.sampled_from(["registry.test/a", "other.test/c"]),
                             max_size=2, unique=True),
    "progress": st.sampled_from([0, 5, -1, None]), "total": st.sampled_from([10, -1, None]),
    "bytesPerSecond": st.none() | st.floats(0.5, 50)})
node_views = st.none() | st.fixed_dictionaries({
    "pulls": st.lists(pull, max_size=3), "slotsFree": st.sampled_from([0, 1, None]),
    "inFlight": st.integers(0, 3),
    "slots": st.fixed_dictionaries({"limit": st.sampled_from([1, 2, None])}),
    "presentImages": st.lists(st.sampled_from(
        ["registry.test/a:1", "docker.io/library/busybox:latest"]), max_size=2)})


def _same(got: Mapping[str, Any], want: Mapping[str, Any]) -> None:
    assert json.dumps(got) == json.dumps(want)  # (byte for byte, as encoded)


@settings(derandomize=True, max_examples=600, deadline=None)
@given(pod=pods(), evs=events(), view=node_views, again=node_views,
       later=pods(rv="8"), more=events())
def test_remembered_builds_are_whole_builds(
        pod: dict[str, Any], evs: list[dict[str, Any]], view: dict[str, Any] | None,
        again: dict[str, Any] | None, later: dict[str, Any],
        more: list[dict[str, Any]]) -> None:
    kubepart.forget()
    first = pod_image_pull(pod, evs, view)
    _same(first, _reference(pod, evs, view))
    # a rebuild, its node's bytes moved: the part remembered
    _same(pod_image_pull(pod, evs, again, first), _reference(pod, evs, again, first))
    # the pod changed (a new version), then its events: never the version before's part
    _same(pod_image_pull(later, evs, view, first), _reference(later, evs, view, first))
    moved = copy.deepcopy(more)
    for e in moved:
        e["metadata"]["resourceVersion"] += "1"
    _same(pod_image_pull(later, moved, again), _reference(later, moved, again))
    _same(pod_image_pull(pod, evs, view), first)


@settings(derandomize=True, max_examples=300, deadline=None)
@given(v=st.builds(K8sView, phase=st.sampled_from(["", "Pulling", "Pulled", "Failed"]),
                   error=st.sampled_from(["", "x"]), pull_began=st.none() | st.floats(0, 9),
                   attempt=st.integers(0, 3), failures=st.integers(0, 3),
                   already_present=st.booleans(), pulled_here=st.booleans(),
                   permanent=st.booleans()),
       pulling=st.integers(0, 4), failures=st.integers(0, 4))
def test_counted_is_replace(v: K8sView, pulling: int, failures: int) -> None:
    assert _counted(v, pulling, failures) == dataclasses.replace(
        v, attempt=_attempt(v, pulling, failures), failures=failures)


def _pod(i: int, images: Sequence[str] = ("registry.test/a:1",), rv: str = "1"
         ) -> dict[str, Any]:
    return {"metadata": {"name": f"p{i}", "namespace": "ns1", "uid": f"uid-{i}",
                         "resourceVersion": rv},
            "spec": {"nodeName": "node-a", "containers": [
                {"name": f"c{n}", "image": image} for n, image in enumerate(images)]}}


def test_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """At most ENTRIES parts, least recently used out first; a pod of many or long
    images, or of many events, and an object kube-apiserver did not version, never."""
    kubepart.forget()
    monkeypatch.setattr(kubepart, "ENTRIES", 4)
    for i in range(10):
        pod_image_pull(_pod(i), [], None)
        assert len(kubepart._parts) <= 4
    pod_image_pull(_pod(6), [], None)  # (used again: kept over p7)
    pod_image_pull(_pod(10), [], None)
    assert [k[0] for k in kubepart._parts] == ["uid-8", "uid-9", "uid-6", "uid-10"]
    kubepart.forget()
    pod_image_pull(_pod(1, ["registry.test/a:1"] * (kubepart.MAX_CONTAINERS + 1)), [], None)
    pod_image_pull(_pod(2, ["registry.test/" + "a" * kubepart.MAX_IMAGE_CHARS]), [], None)
    ev = {"metadata": {"name": "e", "namespace": "ns1", "resourceVersion": "3"}}
    pod_image_pull(_pod(3), [ev] * (kubepart.MAX_EVENTS + 1), None)
    unversioned = _pod(4)
    del unversioned["metadata"]["resourceVersion"]
    pod_image_pull(unversioned, [], None)
    pod_image_pull(_pod(5), [{"metadata": {"name": "e", "namespace": "ns1"}}], None)
    assert not kubepart._parts
    pod_image_pull(_pod(6), [ev] * kubepart.MAX_EVENTS, None)
    assert len(kubepart._parts) == 1
