"""The merge policy: which phase a client sees, what a Waiting object reveals."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.imagepullprogress.nodeview import slots_of
from aggapi.auth.capability import ContainerRef

from .scripted import progress

INIT = ContainerRef("init", "reg.example/init:1", "init")
APP = ContainerRef("app", "reg.example/app:1")


def pod(statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"spec": {"nodeName": "n"}, "status": {"containerStatuses": statuses or []}}


def ev(reason: str, container: str, message: str, t: str, count: int = 1,
       kind: str = "containers") -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": t, "count": count,
            "involvedObject": {"fieldPath": f"spec.{kind}{{{container}}}"}}


def full_node(pulls: list[dict[str, Any]], *, new_shape: bool = True) -> dict[str, Any]:
    slots: dict[str, Any] = (
        {"slots": {"limit": 1, "serialize": False, "source": "/var/lib/kubelet/config.yaml",
                   "error": ""}} if new_shape else
        {"kubelet": {"serializeImagePulls": False, "maxParallelImagePulls": 1,
                     "parallelSlots": 1, "source": "/var/lib/kubelet/config.yaml",
                     "error": ""}})
    return {"kind": "NodeImagePulls", "inFlight": len(pulls), "pulls": pulls,
            "slotsFree": 0, **slots}


def test_images_kubelet_has_not_asked_for_are_pending_not_waiting() -> None:
    """The init container's image is pulling; the app's (behind it) is Pending even
    though the node is at its limit. At 622964a the agent's Waiting passed through."""
    m = Merger((INIT, APP))
    m.update(pod(), [ev("Pulling", "init", 'Pulling image "reg.example/init:1"',
                        "2026-01-01T00:00:01Z", kind="initContainers")])
    m.node_view = full_node([{"images": ["reg.example/init:1"],
                              "repositories": ["reg.example/init"]}])
    app = m.apply(progress("app", APP.image, "Waiting"))
    init = m.apply(progress("init", INIT.image, "Waiting"))
    assert app["phase"] == "Pending" and "waiting" not in app
    # the busy slot is init's own pull, just starting: Pulling, not Waiting either
    assert init["phase"] == "Pulling"


def test_a_pull_kubelet_said_pulled_holds_no_slot() -> None:
    """kubelet pulled the init image and now asks for the app's; the node view still
    lists the init pull (its lease outlives the pull by a poll): the app is Pulling.
    CI at ebba24c saw Waiting here once, in test_images_behind_an_init_container."""
    m = Merger((INIT, APP))
    m.update(pod(), [ev("Pulling", "init", 'Pulling image "reg.example/init:1"',
                        "2026-01-01T00:00:01Z", kind="initContainers"),
                     ev("Pulled", "init", 'Successfully pulled image "reg.example/init:1"',
                        "2026-01-01T00:00:05Z", kind="initContainers"),
                     ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:06Z")])
    m.node_view = full_node([{"images": ["reg.example/init:1"],
                              "repositories": ["reg.example/init"]}])
    assert m.apply(progress("app", APP.image, "Unknown"))["phase"] == "Pulling"
    # another image's pull in that slot is a real wait
    m.node_view = full_node([{"images": ["reg.example/x:1"]}])
    assert m.apply(progress("app", APP.image, "Unknown"))["phase"] == "Waiting"


def test_waiting_only_at_the_limit() -> None:
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z")])
    m.node_view = {**full_node([{"images": ["reg.example/x:1"]}]), "slotsFree": 1}
    assert m.apply(progress("app", APP.image, "Waiting"))["phase"] == "Pulling"
    m.node_view = full_node([{"images": ["reg.example/x:1"]}])
    got = m.apply(progress("app", APP.image, "Unknown"))
    assert got["phase"] == "Waiting"
    assert got["waiting"]["limit"] == 1 and got["waiting"]["inFlightCount"] == 1


def other_tenants_pull() -> dict[str, Any]:
    return {"lease": "l1", "images": ["reg.example/tenant-b/secret-app:v7"],
            "repositories": ["reg.example/tenant-b/secret-app"], "phase": "Downloading"}


def test_other_tenants_pulls_are_a_count_only() -> None:
    """At 622964a ``waiting.inFlight`` listed every pull on the node."""
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z")])
    own = {"lease": "l2", "images": ["reg.example/app:1"], "repositories": ["reg.example/app"]}
    m.node_view = full_node([other_tenants_pull(), own])
    w = m.waiting("reg.example/sidecar:2")
    assert w is not None and w["inFlightCount"] == 2
    assert w["inFlight"] == [own]
    assert "tenant-b" not in repr(w)
    m.see_node_pulls = True
    w = m.waiting("reg.example/sidecar:2")
    assert w is not None and len(w["inFlight"]) == 2


def test_slots_from_old_and_new_agents() -> None:
    new = slots_of(full_node([], new_shape=True))
    old = slots_of(full_node([], new_shape=False))
    assert new == old == {"limit": 1, "serialize": False,
                          "source": "/var/lib/kubelet/config.yaml", "error": ""}
    assert slots_of({"slots": {"limit": None, "serialize": None, "source": "",
                               "error": "unreadable"}})["limit"] is None
    assert slots_of({})["limit"] is None


def test_backoff_then_retry_is_pulling_with_the_next_attempt() -> None:
    m = Merger((APP,))
    pulling = ev("Pulling", "app", 'Pulling image "reg.example/app:1"', "2026-01-01T00:00:01Z")
    failed = ev("Failed", "app", 'Failed to pull image "reg.example/app:1": not found',
                "2026-01-01T00:00:02Z")
    backoff = ev("BackOff", "app", 'Back-off pulling image "reg.example/app:1"',
                 "2026-01-01T00:00:03Z")
    status = [{"name": "app", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]
    m.update(pod(status), [pulling, failed, backoff])
    agent_failed = progress("app", APP.image, "Failed", error="lease released")
    got = m.apply(agent_failed)
    assert (got["phase"], got["error"], got["attempt"], got["backOffSeconds"]) == (
        "BackOff", "not found", 1, 10)
    m.update(pod(status), [{**pulling, "count": 2, "lastTimestamp": "2026-01-01T00:00:14Z"},
                           failed, backoff])
    got = m.apply(agent_failed)  # the agent's Failed is the first attempt's
    assert (got["phase"], got["error"], got["attempt"]) == ("Pulling", "", 2)
    assert m.retrying()


@given(st.one_of(st.none(), st.integers(-(2 ** 40), 2 ** 40)),
       st.one_of(st.none(), st.integers(-(2 ** 40), 2 ** 40)),
       st.sampled_from(["Downloading", "Extracting", "Done", "Resolving", "Unknown"]))
def test_sizes_are_a_count_or_null(prog: int | None, total: int | None, phase: str) -> None:
    m = Merger((APP,))
    m.update(pod(), [])
    got = m.apply(progress("app", APP.image, phase, prog, total))
    for k, v in (("progress", prog), ("total", total)):
        assert got[k] == (v if v is not None and v >= 0 else None)
    summary = m.apply({"kind": "Summary", "phase": "Done", "progress": prog, "total": total})
    assert summary["progress"] == (prog if prog is not None and prog >= 0 else None)


def test_a_layer_not_started_in_a_pull_under_way_is_pulling() -> None:
    """Pending is "kubelet has not asked": a layer of a pull kubelet started, with no
    bytes yet, is Pulling. At b8a55c6 it was Pending, and a retried pull went from the
    image's Pulling back to its layers' Pending (issue 37)."""
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z")])
    m.node_view = full_node([{"images": ["reg.example/app:1"]}])
    got = m.apply(progress("app", APP.image, "Waiting", 0, 100, layer="sha256:ab"))
    assert got["phase"] == "Pulling"


def test_a_pull_that_names_no_image_yet_may_be_our_own() -> None:
    """kubelet pulls one at a time and the only pull in flight names no image yet (no
    manifest fetched): it may be this image's own, so Pulling, not Waiting. A pull of
    another repository fills the slot: Waiting."""
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z")])
    m.node_view = full_node([{"lease": "l", "images": [], "repositories": []}])
    assert m.apply(progress("app", APP.image, "Unknown"))["phase"] == "Pulling"
    m.node_view = full_node([{"lease": "l", "images": [], "repositories": ["reg.example/x"]}])
    assert m.apply(progress("app", APP.image, "Unknown"))["phase"] == "Waiting"


def test_the_runtime_moving_beats_kubelets_older_failure() -> None:
    """kubelet's retry is under way but its events still say BackOff: bytes moving (or
    the image there) are the newer truth."""
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z"),
                     ev("Failed", "app", 'Failed to pull image "reg.example/app:1": x',
                        "2026-01-01T00:00:02Z"),
                     ev("BackOff", "app", 'Back-off pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:03Z")])
    assert m.apply(progress("app", APP.image, "Waiting"))["phase"] == "BackOff"
    assert m.apply(progress("app", APP.image, "Downloading", 5, 9))["phase"] == "Downloading"
    assert m.apply(progress("app", APP.image, "Done", 9, 9))["phase"] == "Done"


def test_after_the_pods_own_pull_a_snapshot_says_done_as_the_live_stream_did() -> None:
    """kubelet pulled the image for this pod ('Successfully pulled'); a follow=false
    snapshot's agent, which did not watch that pull, finds it already present. At
    95095d5 that AlreadyPresent passed through where the live stream said Done. An
    image kubelet found present stays AlreadyPresent."""
    m = Merger((INIT, APP))
    m.update(pod(), [
        ev("Pulled", "init", f'Successfully pulled image "{INIT.image}" in 2s', "t1",
           kind="initContainers"),
        ev("Pulled", "app", f'Container image "{APP.image}" already present on machine',
           "t2")])
    assert m.apply(progress("init", INIT.image, "AlreadyPresent", 0, 0))["phase"] == "Done"
    assert m.apply(progress("app", APP.image, "AlreadyPresent", 0, 0))["phase"] \
        == "AlreadyPresent"
    assert m.apply(progress("", "", "AlreadyPresent", 0, 0))["phase"] == "Done"
    summary = m.apply({"kind": "Summary", "phase": "AlreadyPresent", "progress": 0,
                       "total": 0, "images": [
                           {"container": "init", "image": INIT.image,
                            "phase": "AlreadyPresent"},
                           {"container": "app", "image": APP.image,
                            "phase": "AlreadyPresent"}]})
    assert summary["phase"] == "Done"
    assert [i["phase"] for i in summary["images"]] == ["Done", "AlreadyPresent"]


def test_kubelets_pulled_ahead_of_the_runtime_is_not_pending() -> None:
    """kubelet's Pulled reaches the stream before the agent's next look (it looks every
    quarter second): the image is there, the pull does not go back to Pending. At
    b8a55c6 a retried pull went Pulling -> Pending here (issue 37)."""
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z"),
                     ev("Pulled", "app", 'Successfully pulled image "reg.example/app:1" in 3s',
                        "2026-01-01T00:00:04Z")])
    assert m.apply(progress("app", APP.image, "Waiting"))["phase"] == "Done"
    assert m.apply(progress("app", APP.image, "Resolving"))["phase"] == "Done"
    layer = m.apply(progress("app", APP.image, "Waiting", 0, 100, layer="sha256:ab"))
    assert layer["phase"] == "Pulling"


def test_a_pod_granularity_object_waits_when_its_pulling_image_does() -> None:
    """At pod granularity the object names no image: it said Pulling while the pod's
    one image waited for kubelet's only slot and podimagepulls said waitingForSlot (the
    Prometheus e2e, session 37)."""
    m = Merger((APP,))
    m.update(pod(), [ev("Pulling", "app", 'Pulling image "reg.example/app:1"',
                        "2026-01-01T00:00:01Z")])
    m.node_view = full_node([{"images": ["reg.example/x:1"]}])
    out = m.apply(progress("", "", "Unknown"))
    assert out["phase"] == "Waiting" and out["waiting"]["inFlightCount"] == 1
    m.node_view = {**full_node([{"images": ["reg.example/x:1"]}]), "slotsFree": 1}
    assert m.apply(progress("", "", "Unknown"))["phase"] == "Pulling"
