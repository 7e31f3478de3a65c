from typing import Any

from aggapi.apiserver.imagepullprogress.pullstate import views
from aggapi.capability import ContainerRef

C = (ContainerRef("init", "reg/init:1", "init"), ContainerRef("app", "reg/app:1"))


def pod(node: str = "n1", statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"spec": {"nodeName": node}, "status": {"containerStatuses": statuses or []}}


def ev(reason: str, container: str, message: str, t: str, kind: str = "containers"
       ) -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": t,
            "involvedObject": {"fieldPath": f"spec.{kind}{{{container}}}"}}


def test_unscheduled_pod_marks_every_container() -> None:
    v = views(pod(node=""), [], C)
    assert {k: x.phase for k, x in v.items()} == {"init": "Unscheduled", "app": "Unscheduled"}


def test_latest_event_wins_and_error_text_is_kept() -> None:
    evs = [
        ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:01Z"),
        ev("Failed", "app", 'Failed to pull image "reg/app:1": rpc error: not found',
           "2026-01-01T00:00:02Z"),
        ev("BackOff", "app", 'Back-off pulling image "reg/app:1"', "2026-01-01T00:00:03Z"),
        ev("Pulled", "init", 'Container image "reg/init:1" already present on machine',
           "2026-01-01T00:00:00Z", kind="initContainers"),
    ]
    v = views(pod(), evs, C)
    assert v["app"].phase == "BackOff"
    assert v["app"].error == "rpc error: not found"
    assert v["init"].phase == "Pulled" and v["init"].already_present


def test_retry_after_failure_is_pulling_again() -> None:
    evs = [
        ev("Failed", "app", 'Failed to pull image "reg/app:1": boom', "2026-01-01T00:00:02Z"),
        ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:09Z"),
    ]
    assert views(pod(), evs, C)["app"].phase == "Pulling"


def test_container_status_waiting_reason_gives_failure_text() -> None:
    st = [{"name": "app", "state": {"waiting": {"reason": "ErrImagePull",
                                                "message": "manifest unknown"}}}]
    v = views(pod(statuses=st), [], C)
    assert v["app"].phase == "Failed" and v["app"].error == "manifest unknown"
    assert "init" not in v


def test_unrelated_events_are_ignored() -> None:
    evs = [ev("Started", "app", "Started container app", "2026-01-01T00:00:01Z"),
           ev("Pulling", "other", 'Pulling image "x"', "2026-01-01T00:00:01Z")]
    assert views(pod(), evs, C) == {}


def test_kubelets_bare_error_events_keep_the_registry_text() -> None:
    evs = [
        ev("Failed", "app", 'Failed to pull image "reg/app:1": manifest unknown',
           "2026-01-01T00:00:02Z"),
        ev("Failed", "app", "Error: ErrImagePull", "2026-01-01T00:00:03Z"),
        ev("Failed", "app", "Error: ImagePullBackOff", "2026-01-01T00:00:04Z"),
    ]
    v = views(pod(), evs, C)["app"]
    assert (v.phase, v.error) == ("BackOff", "manifest unknown")


def test_retry_wins_over_the_stale_backoff_status() -> None:
    """kubelet keeps ImagePullBackOff in the status while it pulls again; its Pulling
    event (deduplicated: count 2) is newer than the failure. At 622964a the status
    overrode it and the retry was never shown."""
    evs = [
        {**ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:21Z"),
         "count": 2},
        ev("Failed", "app", 'Failed to pull image "reg/app:1": not found',
           "2026-01-01T00:00:02Z"),
        ev("BackOff", "app", 'Back-off pulling image "reg/app:1"', "2026-01-01T00:00:09Z"),
    ]
    st = [{"name": "app", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]
    v = views(pod(statuses=st), evs, C)["app"]
    assert (v.phase, v.attempt, v.failures) == ("Pulling", 2, 1)


def test_failure_in_the_same_second_as_its_pull_is_after_it() -> None:
    evs = [ev("Failed", "app", 'Failed to pull image "reg/app:1": denied',
              "2026-01-01T00:00:02Z"),
           ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:02Z")]
    v = views(pod(), evs, C)["app"]
    assert (v.phase, v.error, v.back_off_seconds) == ("Failed", "denied", 10)


def test_backoff_doubles_to_five_minutes() -> None:
    for failures, want in ((1, 10), (2, 20), (3, 40), (5, 160), (6, 300), (40, 300)):
        evs = [{**ev("Failed", "app", 'Failed to pull image "reg/app:1": x',
                     "2026-01-01T00:00:02Z"), "count": failures}]
        assert views(pod(), evs, C)["app"].back_off_seconds == want


def test_never_retried_failures_are_permanent() -> None:
    st = [{"name": "app", "state": {"waiting": {"reason": "InvalidImageName",
                                                "message": "bad ref"}}}]
    v = views(pod(statuses=st), [], C)["app"]
    assert v.permanent and v.error == "bad ref" and v.back_off_seconds is None


def test_repull_after_a_run_is_pulling_not_pulled() -> None:
    """imagePullPolicy Always: the container ran (imageID set), restarts, and kubelet
    pulls again. At 622964a the old imageID turned that Pulling into Pulled."""
    st = [{"name": "app", "imageID": "reg/app@sha256:aa",
           "state": {"waiting": {"reason": "ContainerCreating"}},
           "lastState": {"terminated": {"startedAt": "2026-01-01T00:00:05Z"}}}]
    evs = [ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:01:00Z")]
    assert views(pod(statuses=st), evs, C)["app"].phase == "Pulling"
    running = [{**st[0], "state": {"running": {"startedAt": "2026-01-01T00:01:09Z"}}}]
    assert views(pod(statuses=running), evs, C)["app"].phase == "Pulled"


def test_a_container_that_fails_to_start_is_not_a_failed_pull() -> None:
    """kubelet reports a start failure with reason Failed and a bare 'Error: ...' too:
    the image was pulled, so the pull view stays Pulled."""
    evs = [
        ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:01Z"),
        ev("Pulled", "app", 'Successfully pulled image "reg/app:1" in 1s',
           "2026-01-01T00:00:02Z"),
        ev("Failed", "app", 'Error: failed to create containerd task: failed to create '
           'shim task: OCI runtime create failed: exec: "/app": no such file or directory',
           "2026-01-01T00:00:03Z"),
        ev("Failed", "app", "Error: RunContainerError", "2026-01-01T00:00:03Z"),
    ]
    v = views(pod(), evs, C)
    assert v["app"].phase == "Pulled" and not v["app"].error
