"""The shared event informers keep only the fields of an Event read (``eventslim``):
the objects, the stream's merge and the kubelet check come out the same from slim
Events as from whole ones, and the rest is not held."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections.podimagepulls import pod_image_pull
from aggapi.apiserver.eventslim import slim_event
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.imagepullprogress.pullstate import kubelet_events
from aggapi.apiserver.pods import target_from_pod
from aggapi.kube.events import from_kubelet
from tests.framework.fakekube import FakeKube

from .collections.fakes import event, pod
from .test_podslim import VIEWS, events, pods
from .test_podsources import synced_source

NOISE = {"apiVersion": "v1", "kind": "Event", "type": "Normal", "action": "Pulling",
         "firstTimestamp": "2026-01-01T00:00:00Z", "reportingController": "kubelet",
         "related": {"kind": "Node", "name": "node-a"}}
META_NOISE = {"uid": "ev-uid", "resourceVersion": "12", "generateName": "x",
              "managedFields": [{"manager": "kubelet"}], "annotations": {"a": "b" * 100}}


@st.composite
def whole_events(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Events as kube-apiserver sends them: what ``events`` draws, with the fields
    nobody reads, other reporters, hosts, uids, series and times."""
    out = []
    for ev in draw(events()):
        ev = {**ev, **draw(st.dictionaries(st.sampled_from(sorted(NOISE)),
                                           st.just(""), max_size=3))}
        for k in list(ev):
            if k in NOISE:
                ev[k] = NOISE[k]
        ev["metadata"] = {**ev["metadata"], **META_NOISE,
                          **draw(st.sampled_from([{}, {"creationTimestamp":
                                                       "2026-01-01T00:00:02Z"}]))}
        ev["involvedObject"] = {**ev["involvedObject"], "apiVersion": "v1",
                                "resourceVersion": "7",
                                "uid": draw(st.sampled_from(["uid-web", "uid-old"]))}
        ev["source"] = draw(st.sampled_from([
            ev["source"], {"component": "kubelet", "host": "node-b"},
            {"component": "tenant"}, {}]))
        ev.update(draw(st.sampled_from([
            {}, {"reportingComponent": "kubelet", "reportingInstance": "node-a"},
            {"reportingComponent": "other"}, {"series": {"count": 4,
                                                         "lastObservedTime": "x"}},
            {"eventTime": "2026-01-01T00:00:02.000000Z", "lastTimestamp": None}])))
        out.append(ev)
    return out


@settings(max_examples=300, deadline=None)
@given(pods(), whole_events(), VIEWS)
def test_slim_events_read_the_same_as_the_whole_ones(
        p: dict[str, Any], evs: list[dict[str, Any]], view: dict[str, Any] | None) -> None:
    slim = [slim_event(e) for e in evs]
    assert pod_image_pull(p, slim, view) == pod_image_pull(p, evs, view)
    assert kubelet_events(p, slim) == [slim_event(e) for e in kubelet_events(p, evs)]
    node = (p.get("spec") or {}).get("nodeName")
    assert [from_kubelet(e, node) for e in slim] == [from_kubelet(e, node) for e in evs]
    whole, thin = (Merger(target_from_pod(p).containers) for _ in range(2))
    whole.update(p, kubelet_events(p, evs))
    thin.update(p, kubelet_events(p, slim))
    assert (thin.k8s, thin._always) == (whole.k8s, whole._always)


@given(whole_events())
def test_slimming_changes_nothing_of_the_event_it_reads(evs: list[dict[str, Any]]) -> None:
    before = copy.deepcopy(evs)
    for e in evs:
        slim_event(e)
    assert evs == before


def test_repeated_strings_are_held_once() -> None:
    a, b = ({"metadata": {"name": f"web.{i}", "namespace": "".join(["n", "s1"])},
             "reason": "".join(["Pull", "ing"]),
             "source": {"component": "kubelet", "host": "".join(["node", "-a"])}}
            for i in range(2))
    sa, sb = slim_event(a), slim_event(b)
    assert sa["metadata"]["namespace"] is sb["metadata"]["namespace"]
    assert sa["reason"] is sb["reason"]
    assert sa["source"]["host"] is sb["source"]["host"]


async def test_the_shared_event_informer_holds_only_what_is_read(kube: FakeKube) -> None:
    p = pod("web-0")
    kube.put("api/v1", "pods", p)
    ev = event(p, "Pulling", 'Pulling image "registry.test/app:1"')
    ev.update(NOISE)
    ev["metadata"].update(META_NOISE)
    kube.put("api/v1", "events", ev)
    async with synced_source(kube, "ns1") as src:
        (kept,) = src.events_of(("ns1", "web-0"))
        assert set(kept) == {"metadata", "involvedObject", "reason", "message",
                             "source", "lastTimestamp"}
        assert set(kept["metadata"]) == {"name", "namespace", "resourceVersion",
                                         "creationTimestamp"}
        assert set(kept["involvedObject"]) == {"name", "namespace", "uid", "fieldPath"}
        assert list(src._events.items.values()) == [kept]


def test_slim_events_keep_what_a_remembered_build_is_keyed_by() -> None:
    """kubepart remembers a build by the pod's and its events' versions: an Event
    slimmed without its resourceVersion made every build a whole one again."""
    from aggapi.apiserver.collections import kubepart
    from aggapi.apiserver.podslim import slim_pod
    p = pod("web-0")
    p["metadata"]["resourceVersion"] = "5"
    ev = event(p, "Pulling", 'Pulling image "registry.test/app:1"')
    ev["metadata"].update(META_NOISE)
    assert kubepart._key(slim_pod(p), [slim_event(ev)]) is not None
