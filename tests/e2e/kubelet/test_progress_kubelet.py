"""pods/imagepullprogress with a real kubelet pulling (issue 9): a > 90 s pull through the
throttle, KEP-3673 waiting live, a missing image, init containers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.kubelet.conftest import (
    GV,
    KImages,
    ProgressStream,
    create_pods,
    delete_pods,
    event_time,
    events,
    follow_pull,
    forget_images,
    get_pod,
    layer_rises,
    obj_time,
    pod,
    wait_for,
)
from tests.framework.controlplane import ControlPlane
from tests.framework.kubelet import Kubelet
from tests.framework.kubetools import has, lacks
from tests.framework.node import Node

MiB = 1 << 20


def _reasons(cp: ControlPlane, name: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ev in events(cp, name):
        out.setdefault(str(ev.get("reason")), []).append(ev)
    return out


# A stream outlasting kube-apiserver's 60 s timeout is tests/e2e/test_long_streams_e2e.py's
# (the same /watch/ path): this one checks the real kubelet's pull against the stream.
def test_real_pull_progress_from_first_bytes_to_pulled(control_plane: ControlPlane,
                                                       node: Node, real_node: Kubelet,
                                                       kimages: KImages) -> None:
    cp = control_plane
    forget_images(node, kimages.big)
    image = node.via_throttle(kimages.big)
    node.set_rate(4.8e6)  # ~157 MB: ~33 s, every layer over many 1 MiB steps
    delete_pods(cp, "kpull")  # left by an earlier failed run
    objs = follow_pull(cp, [pod(node, "kpull", [{"name": "c", "image": image}])], "kpull",
                       reset=lambda: node.set_rate(None), timeout=240)
    # Layer progress from the first bytes to the total, never backwards.
    for digest, size in node.images.big_layers:
        seen = layer_rises(objs, digest, size)
        if size > 40 * MiB:  # 5% is two containerd steps or more at the layer's rate
            first = min(p for p in seen if p > 0)
            assert first < 0.05 * size, f"{digest}: first progress {first} of {size}"
    downloading = [obj_time(o) for o in objs if o.get("phase") == "Downloading"]
    assert downloading[-1] - downloading[0] > 15, "the pull was not followed live"
    # Phases match kubelet's events: Pulling before the first byte, Pulled after the last.
    r = _reasons(cp, "kpull")
    assert "Pulling" in r and "Pulled" in r, sorted(r)
    pulled = r["Pulled"][-1]
    assert "Successfully pulled image" in pulled["message"] and image in pulled["message"]
    assert event_time(r["Pulling"][0]) <= downloading[0] + 1
    assert event_time(pulled) >= downloading[-1] - 2
    summary_t = obj_time(objs[-1])
    assert summary_t >= event_time(pulled) - 2
    delete_pods(cp, "kpull")


@pytest.mark.parametrize(("serialize", "max_parallel"), [
    pytest.param(False, 1, marks=pytest.mark.skipif(
        not has("kubelet-maxParallelImagePulls"), reason=lacks("kubelet-maxParallelImagePulls"))),
    (True, None)], ids=["parallel-max1", "serialized"])
def test_kep3673_waiting_then_downloading(control_plane: ControlPlane, node: Node,
                                          real_node: Kubelet, kimages: KImages,
                                          serialize: bool, max_parallel: int | None) -> None:
    cp, k = control_plane, real_node
    delete_pods(cp, "ka", "kb")  # left by an earlier failed run (before forgetting images)
    k.restart(serialize_image_pulls=serialize, max_parallel_image_pulls=max_parallel)
    forget_images(node, kimages.kep_a, kimages.kep_b)
    img = {"ka": node.via_throttle(kimages.kep_a), "kb": node.via_throttle(kimages.kep_b)}
    node.set_rate(3 * MiB)  # 40 MiB each: ~13 s per pull, one at a time
    streams: dict[str, ProgressStream] = {}
    try:
        create_pods(cp, [pod(node, n, [{"name": "c", "image": i}]) for n, i in img.items()])
        streams = {n: ProgressStream(cp, n, granularity="image").start() for n in img}

        def seen_waiting() -> bool:  # (or both ended: the assertions below say why)
            return any(o.get("phase") == "Waiting" for s in streams.values()
                       for _, o in s.objects) or all(
                s.proc is not None and s.proc.poll() is not None for s in streams.values())

        # Once the second has shown Waiting, 8 MiB/s: ~5 s per pull (20 polls of the
        # second's Downloading) instead of ~13 s.
        wait_for(seen_waiting, 120, "a pull Waiting")
        node.set_rate(8 * MiB)
        for s in streams.values():
            assert s.wait(180) == 0, s.stderr
    finally:
        node.set_rate(None)
        for s in streams.values():
            s.stop()

    def waits_for(name: str, other: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, o) for t, o in streams[name].objects if o.get("phase") == "Waiting"
                and any(img[other] in (p.get("images") or [])
                        for p in (o.get("waiting") or {}).get("inFlight") or [])]

    second = [n for n, other in (("ka", "kb"), ("kb", "ka")) if waits_for(n, other)]
    assert len(second) == 1, {n: [(o.get("kind"), o.get("phase"), o.get("progress"),
                                   [p.get("images") for p in
                                    (o.get("waiting") or {}).get("inFlight") or []])
                                  for _, o in s.objects][:12] for n, s in streams.items()}
    b = second[0]
    a = "kb" if b == "ka" else "ka"
    waiting = waits_for(b, a)
    w = waiting[0][1]["waiting"]
    # The node's slots as a number (at 622964a: the kubelet config's dict).
    assert w["limit"] == 1 and w["slots"]["limit"] == 1
    assert w["slots"]["serialize"] is serialize
    assert w["inFlightCount"] >= 1
    # Waiting means only "at the limit": before kubelet said Pulling, it was Pending.
    phases = [o.get("phase") for _, o in streams[b].objects if o.get("kind") == "Progress"]
    assert set(phases[:phases.index("Waiting")]) <= {"Pending", "Pulling"}, phases
    # The second moves to Downloading once the first pull ends.
    a_done = streams[a].first(lambda o: o.get("kind") == "Summary")
    b_dl = streams[b].first(lambda o: o.get("phase") == "Downloading"
                            and int(o.get("progress") or 0) > 0)
    assert a_done is not None and b_dl is not None
    assert obj_time(b_dl[1]) >= obj_time(a_done[1]) - 3
    assert waiting[-1][0] <= b_dl[0]
    assert streams[b].objects[-1][1]["kind"] == "Summary"
    # kubelet said Pulling for both before the second's bytes started.
    assert event_time(_reasons(cp, b)["Pulling"][0]) <= obj_time(waiting[0][1]) + 1
    delete_pods(cp, "ka", "kb")


def test_missing_image_backoff_then_snapshot(control_plane: ControlPlane, node: Node,
                                            real_node: Kubelet, kimages: KImages) -> None:
    """A followed stream shows Failed and BackOff with the registry's text and stays
    open for kubelet's retries; a follow=false snapshot reports the BackOff as it is
    and ends with one Error."""
    cp = control_plane
    image = node.via_registry(kimages.missing)
    delete_pods(cp, "kmiss")  # left by an earlier failed run
    create_pods(cp, [pod(node, "kmiss", [{"name": "c", "image": image}])])
    first = ProgressStream(cp, "kmiss").start()
    try:
        wait_for(lambda: any(o.get("phase") == "BackOff" for _, o in first.objects), 120,
                 "BackOff on the followed stream")
        assert first.proc is not None and first.proc.poll() is None  # still following
    finally:
        first.stop()
    backoff = next(o for _, o in first.objects if o.get("phase") == "BackOff")
    assert "not found" in backoff["error"] and kimages.missing.split(":")[0] in backoff["error"]
    assert not [o for _, o in first.objects if o.get("kind") in ("Summary", "Error")]

    def backoff_status() -> bool:
        st = get_pod(cp, "kmiss")["status"].get("containerStatuses") or [{}]
        return bool((st[0].get("state") or {}).get("waiting", {}).get("reason")
                    == "ImagePullBackOff")

    wait_for(backoff_status, 90, "ImagePullBackOff")
    snaps: list[list[dict[str, Any]]] = []

    def snapshot_in_backoff() -> bool:
        r = cp.kubectl("get", "--raw", f"{GV}/namespaces/default/pods/kmiss/imagepullprogress"
                       "?follow=false")
        snaps.append([json.loads(line) for line in r.stdout.splitlines() if line.strip()])
        return any(o.get("phase") == "BackOff" for o in snaps[-1])

    # kubelet's status lags its events: a snapshot taken as the status says
    # ImagePullBackOff can fall in the next attempt's Failed, before its BackOff event
    # (CI at integ2). Each snapshot ends with one Error; one shows the back-off.
    wait_for(snapshot_in_backoff, 60, "a snapshot showing the BackOff")
    for objs in snaps:
        assert [o["kind"] for o in objs if o["kind"] != "Progress"] == ["Error"], objs
    objs = snaps[-1]
    assert [o["kind"] for o in objs if o["kind"] != "Progress"] == ["Error"], objs
    assert objs[-1]["phase"] == "BackOff" and "not found" in objs[-1]["error"]
    # The same registry text as kubelet's Failed event.
    failed = [e for e in events(cp, "kmiss") if e.get("reason") == "Failed"
              and "Failed to pull image" in e.get("message", "")]
    assert failed and "not found" in failed[0]["message"]
    delete_pods(cp, "kmiss")


def test_init_container_and_two_apps(control_plane: ControlPlane, node: Node,
                                     real_node: Kubelet, kimages: KImages) -> None:
    cp = control_plane
    forget_images(node, kimages.init, kimages.app_a, kimages.app_b)
    images = {"init": node.via_throttle(kimages.init), "app-a": node.via_throttle(kimages.app_a),
              "app-b": node.via_throttle(kimages.app_b)}
    node.set_rate(2 * MiB)
    delete_pods(cp, "kinit")  # left by an earlier failed run
    objs = follow_pull(cp, [pod(node, "kinit", [
        {"name": "app-a", "image": images["app-a"]},
        {"name": "app-b", "image": images["app-b"]}],
        init_containers=[{"name": "init", "image": images["init"],
                          "command": ["/bin/busybox", "true"]}])], "kinit",
        reset=lambda: node.set_rate(None), timeout=180, granularity="image")
    for name, image in images.items():
        mine = [o for o in objs if o.get("container") == name and o.get("kind") == "Progress"]
        assert mine, f"no progress for {name}"
        assert all(o["image"] == image for o in mine)
        assert any(0 < (o["progress"] or 0) < (o["total"] or 0) for o in mine), \
            f"{name}: no partial progress seen"
    delete_pods(cp, "kinit")
