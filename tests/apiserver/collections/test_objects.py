"""PodImagePull objects agree with the per-pod stream (issue 36 item 3): an image
shared by several containers counts once, totals stay after Done, and the phases
are those the stream shows."""

from __future__ import annotations

from typing import Any

from aggapi.apiserver.collections.podimagepulls import pod_image_pull
from tests import kubeobjects

from .fakes import event, node_view, pull

IMAGE = "registry.test/app:1"
MIB24 = 25_173_728


def _pod(**kw: Any) -> dict[str, Any]:
    return kubeobjects.pod_object("web", [("app", IMAGE)], node="node-a", namespace="ns1",
                                  uid="uid-web", **kw)


def _pulling(p: dict[str, Any], container: str, kind: str = "containers") -> dict[str, Any]:
    ev = event(p, "Pulling", f'Pulling image "{IMAGE}"')
    ev["involvedObject"]["fieldPath"] = f"spec.{kind}{{{container}}}"
    ev["metadata"]["name"] += container
    return ev


def _pulled(p: dict[str, Any], container: str, message: str,
            kind: str = "containers") -> dict[str, Any]:
    ev = event(p, "Pulled", message, when="2026-01-01T00:00:09Z")
    ev["involvedObject"]["fieldPath"] = f"spec.{kind}{{{container}}}"
    ev["metadata"]["name"] += container
    return ev


def test_an_image_shared_by_init_and_app_counts_once() -> None:
    """At 95095d5 the total was 50,347,456 (the one 24 MiB pull counted per
    container) and the rate doubled, where the stream's pod granularity says 25,173,728."""
    p = _pod(init=[("init", IMAGE)])
    # and an image volume of the same image
    p["spec"]["volumes"] = [{"name": "data", "image": {"reference": "registry.test/app:1"}}]
    evs = [_pulling(p, "init", "initContainers")]
    view = node_view(pull("registry.test/app", progress=1000, total=MIB24, rate=100.0))
    obj = pod_image_pull(p, evs, view)
    st = obj["status"]
    assert [i["container"] for i in st["images"]] == ["init", "app", "data"]
    assert (st["progress"], st["total"], st["bytesPerSecond"]) == (1000, MIB24, 100.0)


def test_totals_stay_after_done() -> None:
    """kubelet says Pulled and the pull leaves the node view: at 95095d5 progress and
    total became null; the stream keeps them (progress == total)."""
    p = _pod()
    pulling = [_pulling(p, "app")]
    before = pod_image_pull(p, pulling, node_view(
        pull("registry.test/app", progress=MIB24 - 5, total=MIB24, rate=10.0)))
    done_events = [*pulling, _pulled(p, "app", f'Successfully pulled image "{IMAGE}" in 2s')]
    after = pod_image_pull(p, done_events, None, previous=before)
    [image] = after["status"]["images"]
    assert image["phase"] == "Done"
    assert (image["progress"], image["total"]) == (MIB24, MIB24)
    assert (after["status"]["progress"], after["status"]["total"]) == (MIB24, MIB24)
    # and again (the object it rebuilds from already says Done)
    again = pod_image_pull(p, done_events, None, previous=after)
    assert again["status"]["total"] == MIB24
    # an earlier pod of the same name tells nothing about this one's bytes
    other = {**before, "metadata": {**before["metadata"], "uid": "uid-old"}}
    fresh = pod_image_pull(p, done_events, None, previous=other)
    assert fresh["status"]["images"][0]["total"] is None


def test_already_present_images_add_no_bytes_as_in_the_stream() -> None:
    """The stream's pod granularity sums only the images that need downloading:
    every image present is 0 of 0, not unknown."""
    p = _pod(init=[("init", IMAGE)])
    evs = [_pulled(p, c, f'Container image "{IMAGE}" already present on machine', k)
           for c, k in (("init", "initContainers"), ("app", "containers"))]
    st = pod_image_pull(p, evs, None)["status"]
    assert st["phase"] == "AlreadyPresent"
    assert (st["progress"], st["total"]) == (0, 0)


def test_ages_read_as_kubectl_prints_them() -> None:
    """apimachinery's HumanDuration, which kubectl's AGE column uses."""
    from aggapi.apiserver.collections.table import age, human_duration
    cases = {0: "0s", 119: "119s", 120: "2m", 330: "5m30s", 600: "10m", 10799: "179m",
             3 * 3600: "3h", 3 * 3600 + 60: "3h1m", 8 * 3600: "8h", 47 * 3600: "47h",
             48 * 3600: "2d", 2 * 86400 + 3600: "2d1h", 8 * 86400: "8d",
             2 * 365 * 86400: "2y", 2 * 365 * 86400 + 86400: "2y1d",
             8 * 365 * 86400: "8y", -1: "0s", -5: "<invalid>"}
    assert {s: human_duration(s) for s in cases} == cases
    obj = {"metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"}}
    assert age(obj, now=1767225600 + 300) == "5m"
    assert age({"metadata": {}}) == "<unknown>"


def test_an_image_on_the_node_is_already_present_before_kubelets_event() -> None:
    """The stream's agent finds the image's record and says AlreadyPresent at once; at
    95095d5 the collection said Pending until kubelet's Pulled event. Under
    imagePullPolicy Always kubelet pulls it again: Pending, as the stream says."""
    p = _pod()
    view = node_view()
    view["presentImages"] = ["registry.test/app:1", "registry.test/other:2"]
    obj = pod_image_pull(p, [], view)
    [image] = obj["status"]["images"]
    assert image["phase"] == "AlreadyPresent" and obj["status"]["phase"] == "AlreadyPresent"
    assert (obj["status"]["progress"], obj["status"]["total"]) == (0, 0)
    # no longer polled (every image present): it stays so until kubelet's word
    assert pod_image_pull(p, [], None, previous=obj)["status"]["images"][0]["phase"] \
        == "AlreadyPresent"
    assert pod_image_pull(p, [], node_view())["status"]["images"][0]["phase"] == "Pending"
    always = _pod()
    always["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    assert pod_image_pull(always, [], view)["status"]["images"][0]["phase"] == "Pending"
