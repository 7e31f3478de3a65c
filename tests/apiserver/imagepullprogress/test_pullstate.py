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
