"""The shared pod informers keep only the fields read (``podslim``): the objects and
the stream's merge come out the same from a slim pod as from the whole one, and the
rest (env, ports, resources, conditions, owners, annotations) is not held."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections.podimagepulls import pod_image_pull
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.pods import target_from_pod
from aggapi.apiserver.podslim import slim_pod
from aggapi.apiserver.podsources import Sources
from tests.apiserver.podstates import container_states
from tests.framework.fakekube import FakeKube

NAMES = ["app", "side", "init", "vol"]
IMAGES = ["busybox", "registry.test/app:1", "registry.test/app@sha256:" + "a" * 64,
          "Bad Ref", "localhost:5000/x/y:2"]
NOISE = st.dictionaries(st.sampled_from(["env", "ports", "resources", "volumeMounts",
                                         "conditions", "hostIP", "extra"]),
                        st.just([{"name": "X", "value": "1"}]), max_size=3)
POLICIES = ["Always", "IfNotPresent"]
TIMES = ["2026-01-01T00:00:01Z", "2026-01-01T00:00:02Z", "2026-01-01T00:00:03Z"]


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    def container(kind: str) -> dict[str, Any]:
        c = {"name": draw(st.sampled_from(NAMES)), "image": draw(st.sampled_from(IMAGES)),
             **draw(NOISE)}
        if draw(st.booleans()):
            c["imagePullPolicy"] = draw(st.sampled_from(POLICIES))
        return c

    def cstatus() -> dict[str, Any]:
        state = draw(container_states(TIMES))
        return {"name": draw(st.sampled_from(NAMES)), "image": draw(st.sampled_from(IMAGES)),
                "imageID": draw(st.sampled_from(["", "sha256:" + "b" * 64])),
                "state": state, "ready": False, "restartCount": 0, **draw(NOISE)}

    spec: dict[str, Any] = {k: [container(k) for _ in range(draw(st.integers(0, 2)))]
                            for k in ("initContainers", "containers")
                            if draw(st.booleans())}
    spec["volumes"] = [{"name": "cfg", "configMap": {"name": "c"}}] + (
        [{"name": "vol", "image": {"reference": draw(st.sampled_from(IMAGES)),
                                   "pullPolicy": draw(st.sampled_from(POLICIES))}}]
        if draw(st.booleans()) else [])
    if draw(st.booleans()):
        spec["nodeName"] = "node-a"
    spec.update({"restartPolicy": "Always", "serviceAccountName": "default"})
    status: dict[str, Any] = {"phase": draw(st.sampled_from(["Pending", "Running"])),
                              "conditions": [{"type": "Ready", "status": "False"}]}
    for k in ("initContainerStatuses", "containerStatuses"):
        if draw(st.booleans()):
            status[k] = [cstatus() for _ in range(draw(st.integers(0, 2)))]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "ns1", "uid": "uid-web",
                         "creationTimestamp": "2026-01-01T00:00:00Z",
                         "labels": {"app": "web"}, "annotations": {"a": "b" * 100},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}],
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": spec, "status": status}


@st.composite
def events(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 4))):
        reason = draw(st.sampled_from(["Pulling", "Pulled", "Failed", "BackOff"]))
        name = draw(st.sampled_from(NAMES))
        image = draw(st.sampled_from(IMAGES))
        message = {"Pulling": f'Pulling image "{image}"',
                   "Pulled": draw(st.sampled_from([
                       f'Successfully pulled image "{image}" in 1.5s',
                       f'Container image "{image}" already present on machine'])),
                   "Failed": f'Failed to pull image "{image}": not found',
                   "BackOff": f'Back-off pulling image "{image}"'}[reason]
        out.append({"metadata": {"name": f"web.{i}", "namespace": "ns1"},
                    "involvedObject": {"kind": "Pod", "name": "web", "namespace": "ns1",
                                       "uid": "uid-web",
                                       "fieldPath": f"spec.containers{{{name}}}"},
                    "reason": reason, "message": message,
                    "source": {"component": "kubelet", "host": "node-a"},
                    "count": draw(st.integers(1, 3)),
                    "lastTimestamp": draw(st.sampled_from(TIMES)), "type": "Normal"})
    return out


VIEWS = st.sampled_from([None, {"pulls": [], "presentImages": [
    "docker.io/library/busybox:latest"]}, {"pulls": [{
        "images": ["registry.test/app:1"], "phase": "Downloading", "progress": 5,
        "total": 10, "bytesPerSecond": 2.0}], "slotsFree": 0, "inFlight": 1, "slots": 1}])


@settings(max_examples=300, deadline=None)
@given(pods(), events(), VIEWS)
def test_a_slim_pod_reads_the_same_as_the_whole_one(
        pod: dict[str, Any], evs: list[dict[str, Any]], view: dict[str, Any] | None) -> None:
    slim = slim_pod(pod)
    assert target_from_pod(slim).containers == target_from_pod(pod).containers
    assert pod_image_pull(slim, evs, view) == pod_image_pull(pod, evs, view)
    whole, thin = (Merger(target_from_pod(p).containers) for p in (pod, slim))
    whole.update(pod, evs)
    thin.update(slim, evs)
    assert (thin.k8s, thin._always) == (whole.k8s, whole._always)


@given(pods())
def test_slimming_changes_nothing_of_the_pod_it_reads(pod: dict[str, Any]) -> None:
    before = repr(pod)
    slim_pod(pod)
    assert repr(pod) == before


async def test_the_shared_informer_holds_only_what_is_read() -> None:
    kube = FakeKube()
    await kube.start()
    api = kube.kube_client()
    sources = Sources(api, linger=0)
    try:
        kube.put("api/v1", "pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "ns1", "uid": "u",
                         "annotations": {"big": "x" * 1000}, "labels": {"app": "web"},
                         "ownerReferences": [{"kind": "ReplicaSet", "name": "rs"}]},
            "spec": {"nodeName": "n1", "containers": [{
                "name": "app", "image": "busybox", "imagePullPolicy": "Always",
                "env": [{"name": "A", "value": "1"}], "ports": [{"containerPort": 80}]}],
                "volumes": [{"name": "cfg", "configMap": {"name": "c"}}],
                "tolerations": [{"key": "k"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready"}],
                       "containerStatuses": [{"name": "app", "image": "busybox",
                                              "imageID": "", "restartCount": 0,
                                              "state": {"waiting": {"reason": "X"}}}]}})
        source = sources.acquire("")
        await source.wait_synced(timeout=10)
        held = source.pod(("ns1", "web"))
        assert held is not None
        for stamped in ("resourceVersion", "creationTimestamp"):  # the fake's own
            held["metadata"].pop(stamped, None)
        assert held == {
            "metadata": {"name": "web", "namespace": "ns1", "uid": "u",
                         "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{
                "name": "app", "image": "busybox", "imagePullPolicy": "Always"}]},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "app", "image": "busybox", "imageID": "",
                "state": {"waiting": {"reason": "X"}}}]}}
        sources.release("")
    finally:
        await sources.close()
        await api.close()
        await kube.stop()
