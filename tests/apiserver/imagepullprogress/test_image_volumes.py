"""Image volumes (KEP-4639) beside containers: kubelet's events for an image volume
name the pod without a fieldPath (kuberuntime getImageVolumes passes the pod's
reference to EnsureImageExists), a container's name the container in their fieldPath.
Volume and container names are separate namespaces, so a volume may be named like a
container: views are keyed by (container|volume, name)."""

from __future__ import annotations

from typing import Any

from aggapi.apiserver.collections.podimagepulls import pod_image_pull
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.imagepullprogress.pullstate import views
from aggapi.apiserver.pods import containers_of

from .scripted import progress

APP_IMG, DATA_IMG = "reg.example/app:1", "reg.example/data:1"
SPEC: dict[str, Any] = {
    "nodeName": "n",
    "containers": [{"name": "data", "image": APP_IMG}],
    "volumes": [{"name": "data", "image": {"reference": DATA_IMG, "pullPolicy": "IfNotPresent"}}],
}


def pod() -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u"},
            "spec": SPEC, "status": {}}


def ev(reason: str, message: str, t: str, container: str = "") -> dict[str, Any]:
    """kubelet's event: about the container ``container``, or (empty) about the pod
    (an image volume's: no fieldPath)."""
    obj: dict[str, Any] = {"kind": "Pod", "name": "p", "namespace": "default", "uid": "u"}
    if container:
        obj["fieldPath"] = f"spec.containers{{{container}}}"
    return {"reason": reason, "message": message, "lastTimestamp": t, "count": 1,
            "involvedObject": obj, "source": {"component": "kubelet", "host": "n"}}


# The container's image arrived; then the volume's pull failed and backs off.
EVENTS = [
    ev("Pulling", f'Pulling image "{APP_IMG}"', "2026-01-01T00:00:01Z", "data"),
    ev("Pulled", f'Successfully pulled image "{APP_IMG}" in 1s', "2026-01-01T00:00:02Z",
       "data"),
    ev("Pulling", f'Pulling image "{DATA_IMG}"', "2026-01-01T00:00:03Z"),
    ev("Failed", f'Failed to pull image "{DATA_IMG}": not found', "2026-01-01T00:00:04Z"),
    ev("BackOff", f'Back-off pulling image "{DATA_IMG}"', "2026-01-01T00:00:05Z"),
]


def test_a_volume_named_like_a_container_keeps_its_own_events() -> None:
    """At b8a55c6 both were one view named "data": the container read the volume's
    BackOff, and the stream's Error named the container's image."""
    m = Merger(containers_of(SPEC))
    m.update(pod(), EVENTS)
    app = m.apply(progress("data", APP_IMG, "AlreadyPresent", 5, 5))
    vol = m.apply(progress("data", DATA_IMG, "Failed", error="lease released"))
    assert app["phase"] == "Done" and not app["error"]  # kubelet pulled it for this pod
    assert vol["phase"] == "BackOff" and vol["error"] == "not found"
    err = m.failure(follow=False)
    assert err is not None and err["image"] == DATA_IMG, err
    v = views(pod(), EVENTS, containers_of(SPEC))
    assert v[("container", "data")].phase == "Pulled"
    assert v[("container", "data")].attempt == 1
    assert v[("volume", "data")].phase == "BackOff"
    assert v[("volume", "data")].error == "not found"


def test_an_event_without_a_fieldpath_is_no_containers() -> None:
    """A container and an image volume of one image: the volume's events (no fieldPath)
    are the volume's alone. At b8a55c6 they went to the first container of the image."""
    spec = {**SPEC, "containers": [{"name": "app", "image": DATA_IMG}]}
    evs = [ev("Pulling", f'Pulling image "{DATA_IMG}"', "2026-01-01T00:00:03Z")]
    v = views({**pod(), "spec": spec}, evs, containers_of(spec))
    assert v == {("volume", "data"): v[("volume", "data")]}
    assert v[("volume", "data")].phase == "Pulling"


def test_the_collection_tells_the_volume_from_the_container() -> None:
    """podimagepulls: one entry each, each with its own kubelet view."""
    obj = pod_image_pull(pod(), EVENTS, None)
    got = {(i["container"], i["image"]): i["phase"] for i in obj["status"]["images"]}
    assert got == {("data", APP_IMG): "Done", ("data", DATA_IMG): "BackOff"}, got
