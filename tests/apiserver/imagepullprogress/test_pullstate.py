from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st_

from aggapi.apiserver.imagepullprogress.pullstate import views
from aggapi.auth.capability import ContainerRef

C = (ContainerRef("init", "reg/init:1", "init"), ContainerRef("app", "reg/app:1"))
APP, INIT = ("container", "app"), ("container", "init")


def pod(node: str = "n1", statuses: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"spec": {"nodeName": node}, "status": {"containerStatuses": statuses or []}}


def ev(reason: str, container: str, message: str, t: str, kind: str = "containers"
       ) -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": t,
            "involvedObject": {"fieldPath": f"spec.{kind}{{{container}}}"}}


def test_unscheduled_pod_marks_every_container() -> None:
    v = views(pod(node=""), [], C)
    assert {k: x.phase for k, x in v.items()} == {INIT: "Unscheduled", APP: "Unscheduled"}


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
    assert v[APP].phase == "BackOff"
    assert v[APP].error == "rpc error: not found"
    assert v[INIT].phase == "Pulled" and v[INIT].already_present


def test_retry_after_failure_is_pulling_again() -> None:
    evs = [
        ev("Failed", "app", 'Failed to pull image "reg/app:1": boom', "2026-01-01T00:00:02Z"),
        ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:09Z"),
    ]
    assert views(pod(), evs, C)[APP].phase == "Pulling"


def test_container_status_waiting_reason_gives_failure_text() -> None:
    st = [{"name": "app", "state": {"waiting": {"reason": "ErrImagePull",
                                                "message": "manifest unknown"}}}]
    v = views(pod(statuses=st), [], C)
    assert v[APP].phase == "Failed" and v[APP].error == "manifest unknown"
    assert INIT not in v


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
    v = views(pod(), evs, C)[APP]
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
    v = views(pod(statuses=st), evs, C)[APP]
    assert (v.phase, v.attempt, v.failures) == ("Pulling", 2, 1)


def test_failure_in_the_same_second_as_its_pull_is_after_it() -> None:
    evs = [ev("Failed", "app", 'Failed to pull image "reg/app:1": denied',
              "2026-01-01T00:00:02Z"),
           ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:00:02Z")]
    v = views(pod(), evs, C)[APP]
    assert (v.phase, v.error, v.back_off_seconds) == ("Failed", "denied", 10)


def test_backoff_doubles_to_five_minutes() -> None:
    for failures, want in ((1, 10), (2, 20), (3, 40), (5, 160), (6, 300), (40, 300)):
        evs = [{**ev("Failed", "app", 'Failed to pull image "reg/app:1": x',
                     "2026-01-01T00:00:02Z"), "count": failures}]
        assert views(pod(), evs, C)[APP].back_off_seconds == want


def test_never_retried_failures_are_permanent() -> None:
    st = [{"name": "app", "state": {"waiting": {"reason": "InvalidImageName",
                                                "message": "bad ref"}}}]
    v = views(pod(statuses=st), [], C)[APP]
    assert v.permanent and v.error == "bad ref" and v.back_off_seconds is None


def test_repull_after_a_run_is_pulling_not_pulled() -> None:
    """imagePullPolicy Always: the container ran (imageID set), restarts, and kubelet
    pulls again. At 622964a the old imageID turned that Pulling into Pulled."""
    st = [{"name": "app", "imageID": "reg/app@sha256:aa",
           "state": {"waiting": {"reason": "ContainerCreating"}},
           "lastState": {"terminated": {"startedAt": "2026-01-01T00:00:05Z"}}}]
    evs = [ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T00:01:00Z")]
    assert views(pod(statuses=st), evs, C)[APP].phase == "Pulling"
    running = [{**st[0], "state": {"running": {"startedAt": "2026-01-01T00:01:09Z"}}}]
    assert views(pod(statuses=running), evs, C)[APP].phase == "Pulled"


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
    assert v[APP].phase == "Pulled" and not v[APP].error


# --- kubelet's events as it names them: '<pod>.<UnixNano in hex>', count 1 ----------

T0 = 1_798_000_000  # a whole second (2026-12-23T...Z)
IMG = 'reg/app:1'
ONE_ATTEMPT_EACH = {  # (reason, message) -> the phase it means on its own
    ("Pulling", f'Pulling image "{IMG}"'): "Pulling",
    ("Failed", f'Failed to pull image "{IMG}": pull QPS exceeded'): "Failed",
    ("Failed", "Error: ErrImagePull"): "Failed",
    ("BackOff", f'Back-off pulling image "{IMG}"'): "BackOff",
    ("Failed", "Error: ImagePullBackOff"): "BackOff",
    ("Pulled", f'Container image "{IMG}" already present on machine'): "Pulled",
}


def kev(reason: str, message: str, at_ns: int) -> dict[str, Any]:
    """An Event as kubelet's recorder creates it (first seen, count 1)."""
    second = datetime.fromtimestamp(at_ns // 10**9, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**ev(reason, "app", message, second), "count": 1,
            "firstTimestamp": second, "metadata": {"name": f"app-7d9.{at_ns:x}"}}


def test_present_on_retry_in_the_failures_second_is_pulled() -> None:
    """The e2e's 20 replicas: kubelet's pull throttle refuses the pull at .20 s and
    the retry 0.68 s later finds the image another replica pulled, in the same second.
    Ranked by reason alone the failure came last, and the pod showed 'Failed: pull
    QPS exceeded' for good (4 of 20 pods, 300 s, while they ran)."""
    evs = [kev("Pulling", f'Pulling image "{IMG}"', (T0 - 8) * 10**9 + 400_000_000),
           kev("Failed", f'Failed to pull image "{IMG}": pull QPS exceeded',
               T0 * 10**9 + 200_000_000),
           kev("Failed", "Error: ErrImagePull", T0 * 10**9 + 200_300_000),
           kev("Pulled", f'Container image "{IMG}" already present on machine',
               T0 * 10**9 + 880_000_000)]
    st = [{"name": "app", "state": {"waiting": {"reason": "ErrImagePull",
                                                "message": "pull QPS exceeded"}}}]
    for statuses in ([], st):  # before and after the status catches up
        v = views(pod(statuses=statuses), list(reversed(evs)), C)[APP]
        assert (v.phase, v.already_present) == ("Pulled", True), statuses


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st_.lists(st_.tuples(st_.sampled_from(sorted(ONE_ATTEMPT_EACH)),
                            st_.integers(0, 999_999_999)),
                 min_size=1, max_size=6, unique_by=lambda e: e[1]),
       st_.randoms(use_true_random=False))
def test_events_of_one_second_count_in_the_order_they_happened(
        emitted: list[tuple[tuple[str, str], int]], rnd: Any) -> None:
    """Whatever kubelet emitted within one second, in any order, the last one says
    the phase (its name carries the time; no status to say otherwise)."""
    evs = [kev(reason, message, T0 * 10**9 + ns) for (reason, message), ns in emitted]
    rnd.shuffle(evs)
    last = max(emitted, key=lambda e: e[1])[0]
    assert views(pod(), evs, C)[APP].phase == ONE_ATTEMPT_EACH[last]


def test_a_repeat_is_older_than_a_new_event_of_its_second() -> None:
    """A repeat's name is its first occurrence's time, so its place in the second is
    unknown: it goes before the second's new events. kubelet's back-off repeats
    (count 3), then the retry finds the image present (a new event)."""
    back_off = {**kev("BackOff", f'Back-off pulling image "{IMG}"',
                      (T0 - 20) * 10**9 + 950_000_000), "count": 3}
    back_off["lastTimestamp"] = kev("x", "", T0 * 10**9)["lastTimestamp"]
    present = kev("Pulled", f'Container image "{IMG}" already present on machine',
                  T0 * 10**9 + 100_000_000)
    assert views(pod(), [present, back_off], C)[APP].phase == "Pulled"


def test_a_container_running_since_a_failure_has_its_image() -> None:
    """kubelet's spam filter drops a pod's events once it failed often: the retry's
    Pulled may never come. The container runs, started no earlier than the failure:
    its image is there. One that ran before the failure (a re-pull under imagePullPolicy
    Always failing) says nothing."""
    evs = [ev("Failed", "app", f'Failed to pull image "{IMG}": pull QPS exceeded',
              "2026-01-01T00:00:07Z"),
           ev("BackOff", "app", f'Back-off pulling image "{IMG}"', "2026-01-01T00:00:09Z")]

    def running(started: str) -> list[dict[str, Any]]:
        return [{"name": "app", "imageID": "reg/app@sha256:aa",
                 "state": {"running": {"startedAt": started}}}]
    assert views(pod(statuses=running("2026-01-01T00:00:09Z")), evs, C)[APP].phase \
        == "Pulled"
    assert views(pod(statuses=running("2026-01-01T00:00:05Z")), evs, C)[APP].phase \
        == "BackOff"


def test_attempt_survives_expired_or_dropped_pulling_events() -> None:
    # kube-apiserver drops an Event an hour (--event-ttl) after its last repeat, and
    # kubelet's spam filter drops repeats of a pod that fails often: the Pulling event
    # can be gone, or counted afresh, while the failures' events still count.
    failed = {**ev("Failed", "app", 'Failed to pull image "reg/app:1": not found',
                   "2026-01-01T01:00:00Z"), "count": 7}
    backoff = {**ev("BackOff", "app", 'Back-off pulling image "reg/app:1"',
                    "2026-01-01T01:00:05Z"), "count": 40}
    v = views(pod(), [failed, backoff], C)[APP]
    assert (v.phase, v.failures, v.attempt) == ("BackOff", 7, 7)
    again = ev("Pulling", "app", 'Pulling image "reg/app:1"', "2026-01-01T01:05:00Z")
    v = views(pod(), [failed, backoff, again], C)[APP]
    assert (v.phase, v.failures, v.attempt) == ("Pulling", 7, 8)
