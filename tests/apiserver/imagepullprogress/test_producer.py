"""The Producer's stream as kubelet lives a pull: the pod and its events come from
the fake kube-apiserver through the real PodWatch; the agent is scripted."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.apiserver.authz import Authorizer, Permits
from aggapi.apiserver.imagepullprogress.handler import SEE_NODE_PULLS
from aggapi.apiserver.imagepullprogress.podwatch import PodWatch
from aggapi.apiserver.imagepullprogress.producer import Producer
from aggapi.apiserver.metrics import Metrics
from aggapi.apiserver.pods import target_from_pod
from aggapi.apiserver.requestinfo import RequestInfo
from aggapi.auth.delegated import UserInfo
from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .scripted import (
    Collected,
    ScriptedAgent,
    done_summary,
    event,
    new_broadcast,
    pod_object,
    progress,
    read_all,
    watch_of,
)

IMG = "reg/app:1"


# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


@contextlib.asynccontextmanager
async def running(kube: FakeKube, pod: dict[str, Any], agent: ScriptedAgent, *,
                  follow: bool, granularity: str = "image",
                  **kw: Any) -> AsyncIterator[tuple[Collected, asyncio.Task[None]]]:
    async with contextlib.asynccontextmanager(watch_of)(kube, pod) as pw:
        assert isinstance(pw, PodWatch)
        target = target_from_pod(pw.pod or pod)
        bc = new_broadcast()
        prod = Producer(bc, agent, pw, target, target.containers, granularity,  # type: ignore[arg-type]
                        follow, "alice", **kw)
        got = Collected([])
        task = asyncio.create_task(prod.run())
        reader = asyncio.create_task(read_all(bc, got.objs))
        try:
            yield got, task
            await asyncio.wait({task}, timeout=10)
            assert task.done()
            if not task.cancelled():
                task.result()
            bc.finish()
            await asyncio.wait_for(reader, 5)
        finally:
            for t in (task, reader):
                t.cancel()
                with contextlib.suppress(BaseException):
                    await t


def node_busy_with(image: str, repo: str) -> dict[str, Any]:
    return {"kind": "NodeImagePulls", "inFlight": 1, "slotsFree": 0,
            "slots": {"limit": 1, "serialize": True, "source": "kubelet.yaml", "error": ""},
            "pulls": [{"lease": "l1", "images": [image], "repositories": [repo],
                       "phase": "Downloading", "progress": 1, "total": 9}]}


def set_status(kube: FakeKube, pod: dict[str, Any], reason: str, message: str = "") -> None:
    pod["status"] = {"containerStatuses": [{"name": "app", "image": IMG, "imageID": "",
                                             "state": {"waiting": {"reason": reason,
                                                                   "message": message}}}]}
    kube.put("api/v1", "pods", pod)


async def test_follow_stays_open_across_backoff_and_shows_each_attempt(
        kube: FakeKube) -> None:
    """Pulling -> Downloading -> Failed -> BackOff -> Pulling (attempt 2) -> Done, one
    Summary at the end. At 622964a the agent's Error (or kubelet's BackOff) ended it."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    pulling = event(pod, "Pulling", "app", f'Pulling image "{IMG}"', "2026-01-01T00:00:01Z",
                    name="p.pulling")
    kube.put("api/v1", "events", pulling)
    agent = ScriptedAgent()
    first = agent.stream()
    async with running(kube, pod, agent, follow=True) as (got, _):
        first.send(progress("app", IMG, "Downloading", 10, 100))
        await until(lambda: "Downloading" in got.phases())
        first.send(progress("app", IMG, "Failed", 10, 100, error="lease released"),
                   {"kind": "Error", "container": "app", "image": IMG, "phase": "Failed",
                    "error": "lease released"})
        first.end()
        await until(lambda: "Failed" in got.phases())
        # kubelet's side of the failure: registry text, then back-off.
        kube.put("api/v1", "events", event(
            pod, "Failed", "app", f'Failed to pull image "{IMG}": manifest unknown',
            "2026-01-01T00:00:02Z"))
        kube.put("api/v1", "events", event(pod, "BackOff", "app",
                                           f'Back-off pulling image "{IMG}"',
                                           "2026-01-01T00:00:03Z"))
        set_status(kube, pod, "ImagePullBackOff", f'Back-off pulling image "{IMG}"')
        await until(lambda: "BackOff" in got.phases())
        backoff = next(o for o in got.objs if o.get("phase") == "BackOff")
        assert backoff["error"] == "manifest unknown"
        assert backoff["attempt"] == 1 and backoff["backOffSeconds"] == 10
        assert not got.finals()
        # The retry: kubelet's recorder bumps the same Pulling event; the container's
        # status still says ImagePullBackOff.
        second = agent.stream()
        kube.put("api/v1", "events", {**pulling, "count": 2,
                                      "lastTimestamp": "2026-01-01T00:00:15Z"})
        await until(lambda: len(agent.opened) == 2)
        second.send(progress("app", IMG, "Downloading", 50, 100))
        await until(lambda: got.phases()[-1:] == ["Downloading"])
        second.send(progress("app", IMG, "Done", 100, 100),
                    done_summary("app", IMG, 100, 100))
        second.end()
    assert got.phases() == ["Downloading", "Failed", "BackOff", "Pulling", "Downloading",
                            "Done"]
    attempts = [o["attempt"] for o in got.objs if o.get("kind") == "Progress"]
    assert attempts == sorted(attempts) and attempts[-1] == 2
    assert [o["kind"] for o in got.finals()] == ["Summary"] and got.objs[-1]["kind"] == "Summary"
    assert got.objs[-1]["complete"] is True


async def test_permanent_failure_ends_a_followed_stream(kube: FakeKube) -> None:
    pod = pod_object(containers=(("app", "reg/App:bad"),))
    kube.put("api/v1", "pods", pod)
    agent = ScriptedAgent()
    lines = agent.stream()
    async with running(kube, pod, agent, follow=True) as (got, _):
        lines.send(progress("app", "reg/App:bad", "Unknown"))
        await until(lambda: got.objs)
        set_status(kube, pod, "InvalidImageName", "invalid reference format")
    assert [o["kind"] for o in got.finals()] == ["Error"]
    assert got.objs[-1]["error"] == "invalid reference format"


async def test_snapshot_ends_with_one_summary(kube: FakeKube) -> None:
    """follow=false while nothing is present: one Summary (complete false) ends it.
    At 622964a the stream ended with no final object."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    agent = ScriptedAgent()
    lines = agent.stream()
    lines.send(progress("app", IMG, "Waiting"))
    lines.end()
    async with running(kube, pod, agent, follow=False) as (got, _):
        pass
    assert got.phases() == ["Pending"]  # kubelet has not asked for it: not Waiting
    assert [o["kind"] for o in got.finals()] == ["Summary"]
    summary = got.objs[-1]
    assert summary["complete"] is False and summary["phase"] == "Pending"
    assert summary["images"] == [{"container": "app", "image": IMG, "phase": "Pending"}]
    assert summary["progress"] is None and summary["total"] is None


async def test_unscheduled_snapshot_ends_with_one_summary(kube: FakeKube) -> None:
    pod = pod_object(node="")
    kube.put("api/v1", "pods", pod)
    async with running(kube, pod, ScriptedAgent(), follow=False) as (got, _):
        pass
    assert got.phases() == ["Unscheduled"]
    assert [o["kind"] for o in got.finals()] == ["Summary"]
    assert got.objs[-1]["phase"] == "Unscheduled" and got.objs[-1]["complete"] is False


async def test_snapshot_reports_backoff_as_it_is(kube: FakeKube) -> None:
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    for reason, msg, t in (("Pulling", f'Pulling image "{IMG}"', "01"),
                           ("Failed", f'Failed to pull image "{IMG}": denied', "02"),
                           ("BackOff", f'Back-off pulling image "{IMG}"', "03")):
        kube.put("api/v1", "events", event(pod, reason, "app", msg, f"2026-01-01T00:00:{t}Z"))
    agent = ScriptedAgent()
    lines = agent.stream()
    lines.send(progress("app", IMG, "Waiting"))
    lines.end()
    async with running(kube, pod, agent, follow=False) as (got, _):
        pass
    assert got.phases() == ["BackOff"]
    assert [(o["kind"], o["phase"], o["error"]) for o in got.finals()] == [
        ("Error", "BackOff", "denied")]


async def test_unknown_sizes_are_null(kube: FakeKube) -> None:
    """The agent's -1 (older agents) and null both reach the client as null."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    agent = ScriptedAgent()
    lines = agent.stream()
    lines.send(progress("app", IMG, "Resolving", -1, -1),
               progress("app", IMG, "Resolving", None, None, layer="sha256:ab"))
    lines.end()
    async with running(kube, pod, agent, follow=False, granularity="layer") as (got, _):
        pass
    prog = [o for o in got.objs if o["kind"] == "Progress"]
    assert len(prog) == 2
    assert all(o["progress"] is None and o["total"] is None for o in prog)


@pytest.mark.parametrize(("user", "sees"), [("bob", False), ("node-admin", True)])
async def test_two_tenants_waiting_for_a_slot(kube: FakeKube, user: str, sees: bool) -> None:
    """alice's pod (namespace tenant-a) holds the node's one pull slot; bob's pod
    (tenant-b) waits. bob, who may read his own pod's progress but not the node's
    pulls, sees a count; a user granted get nodes/imagepulls (SubjectAccessReview
    through the real Authorizer, against the fake kube-apiserver) sees the pull.
    At 622964a the Waiting object listed alice's image to anyone."""
    alice_img, bob_img = "reg.example/tenant-a/payroll:3", "reg.example/tenant-b/web:1"
    kube.put("api/v1", "pods", pod_object("payroll", (("app", alice_img),),
                                          namespace="tenant-a"))
    pod = pod_object("web", (("app", bob_img),), namespace="tenant-b")
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{bob_img}"',
                                       "2026-01-01T00:00:01Z"))

    def policy(spec: dict[str, Any]) -> bool:
        ra = spec.get("resourceAttributes") or {}
        if (ra.get("resource"), ra.get("subresource")) == ("nodes", "imagepulls"):
            return bool(spec["user"] == "node-admin" and ra.get("verb") == "get")
        return ra.get("namespace") == "tenant-b"

    kube.sar_policy = policy
    agent = ScriptedAgent(node_view=node_busy_with(alice_img, "reg.example/tenant-a/payroll"))
    lines = agent.stream()
    async with kube.kube_client() as api:
        info = RequestInfo(path="/x", verb="get", is_resource_request=True,
                           api_group="subresources.aggapi.io", api_version="v1alpha1",
                           resource="pods", subresource="imagepullprogress",
                           namespace="tenant-b", name="web")
        permits = Permits(Authorizer(api, Metrics()), UserInfo(user), info, "GET",
                          (SEE_NODE_PULLS,))
        async with running(kube, pod, agent, follow=True,
                           may_see_node_pulls=lambda: permits.allows(SEE_NODE_PULLS)
                           ) as (got, task):
            lines.send(progress("app", bob_img, "Waiting"))
            await until(lambda: any(o.get("phase") == "Waiting" for o in got.objs))
            task.cancel()
    waiting = next(o for o in got.objs if o.get("phase") == "Waiting")["waiting"]
    assert waiting["inFlightCount"] == 1 and waiting["limit"] == 1
    assert ("payroll" in repr(waiting)) is sees
    assert len(waiting["inFlight"]) == (1 if sees else 0)
    node_reviews = [c for c in kube.sar_calls
                    if c["spec"]["resourceAttributes"]["resource"] == "nodes"]
    assert len(node_reviews) == 1
    assert node_reviews[0]["spec"]["resourceAttributes"]["namespace"] == ""


async def test_snapshot_ends_with_the_agents_failure_when_kubelet_has_not_said(
        kube: FakeKube) -> None:
    """The runtime saw the pull fail before kubelet's events arrived: the snapshot's one
    final object is the agent's Error."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                       "2026-01-01T00:00:01Z"))
    agent = ScriptedAgent()
    lines = agent.stream()
    lines.send(progress("app", IMG, "Failed", error="lease released"),
               {"kind": "Error", "container": "app", "image": IMG, "phase": "Failed",
                "error": "lease released"})
    lines.end()
    async with running(kube, pod, agent, follow=False) as (got, _):
        pass
    assert got.phases() == ["Failed"]
    assert [(o["kind"], o["error"]) for o in got.finals()] == [("Error", "lease released")]
    assert got.objs[-1]["kind"] == "Error"


async def test_agent_failure_contradicted_by_kubelet_is_asked_again(kube: FakeKube) -> None:
    """The agent saw a lease go without an image, but kubelet says Pulled: the
    stream asks the agent again (not after RETRY_POLL) and ends with its Summary."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                       "2026-01-01T00:00:01Z"))
    agent = ScriptedAgent()
    first = agent.stream()
    async with running(kube, pod, agent, follow=True) as (got, _):
        first.send(progress("app", IMG, "Failed", error="lease released"),
                   {"kind": "Error", "container": "app", "image": IMG, "phase": "Failed",
                    "error": "lease released"})
        first.end()
        await until(lambda: "Failed" in got.phases())
        second = agent.stream()
        kube.put("api/v1", "events", event(
            pod, "Pulled", "app", f'Successfully pulled image "{IMG}" in 1s',
            "2026-01-01T00:00:02Z"))
        await until(lambda: len(agent.opened) == 2, within=3)
        second.send(progress("app", IMG, "Done", 5, 5),
                    done_summary("app", IMG, 5, 5))
        second.end()
    assert [o["kind"] for o in got.finals()] == ["Summary"]


async def test_always_repull_of_a_present_image_is_followed(kube: FakeKube) -> None:
    """imagePullPolicy Always and the image is there: the agent's first answer is
    AlreadyPresent and a Summary, but kubelet pulls again. The stream follows that pull
    and ends with the agent's Summary once it saw the bytes. At 622964a the first
    Summary ended it."""
    pod = pod_object()
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    kube.put("api/v1", "pods", pod)
    present = {"kind": "Summary", "phase": "AlreadyPresent", "progress": None, "total": None,
               "images": [{"container": "app", "image": IMG, "phase": "AlreadyPresent"}]}
    agent = ScriptedAgent()
    first = agent.stream()
    first.send(progress("app", IMG, "AlreadyPresent", 9, 9), present)
    first.end()
    async with running(kube, pod, agent, follow=True) as (got, _):
        await until(lambda: got.phases() == ["Pending"] and len(agent.opened) == 2)
        kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                           "2026-01-01T00:00:01Z"))
        # the agent, asked again, still finds the old record (no lease seen yet)
        again = agent.stream()
        again.send(progress("app", IMG, "AlreadyPresent", 9, 9), present)
        again.end()
        await until(lambda: got.phases()[-1:] == ["Pulling"])
        pull = agent.stream()
        pull.send(progress("app", IMG, "Downloading", 3, 12))
        await until(lambda: got.phases()[-1:] == ["Downloading"])
        pull.send(progress("app", IMG, "Done", 12, 12),
                  {**present, "phase": "Done",
                   "images": [{"container": "app", "image": IMG, "phase": "Done"}]})
        pull.end()
    assert got.phases() == ["Pending", "Pulling", "Downloading", "Done"]
    assert [o["phase"] for o in got.finals()] == ["Done"]


AGENT_PHASES = ("Waiting", "Unknown", "Resolving", "Downloading", "Extracting", "Done",
                "AlreadyPresent", "Failed")
KUBELET = st.lists(st.sampled_from(["Pulling", "Failed", "BackOff", "Pulled"]), max_size=4)
AGENT = st.lists(st.sampled_from(AGENT_PHASES), max_size=5)
END = st.sampled_from(["eof", "summary", "error"])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kubelet=KUBELET, agent_phases=AGENT, end=END, scheduled=st.booleans())
def test_a_snapshot_always_ends_with_exactly_one_final_object(
        kubelet: list[str], agent_phases: list[str], end: str, scheduled: bool) -> None:
    """Whatever kubelet said and the agent sent, a follow=false stream's last object
    is its only Summary/Error."""

    async def run() -> Collected:
        kube = FakeKube()
        await kube.start()
        try:
            pod = pod_object(node="node-a" if scheduled else "")
            kube.put("api/v1", "pods", pod)
            for i, reason in enumerate(kubelet):
                msg = (f'Failed to pull image "{IMG}": boom' if reason == "Failed"
                       else f'{reason} image "{IMG}"')
                kube.put("api/v1", "events", event(pod, reason, "app", msg,
                                                   f"2026-01-01T00:00:0{i}Z"))
            agent = ScriptedAgent()
            lines = agent.stream()
            lines.send(*(progress("app", IMG, p) for p in agent_phases))
            if end == "summary":
                lines.send(done_summary("app", IMG, -1, -1))
            elif end == "error":
                lines.send({"kind": "Error", "container": "app", "image": IMG,
                            "phase": "Failed", "error": "gone"})
            lines.end()
            async with running(kube, pod, agent, follow=False) as (got, _):
                pass
            return got
        finally:
            await kube.stop()

    got = asyncio.run(run())
    assert len(got.finals()) == 1, got.objs
    assert got.objs[-1] is got.finals()[0]
    assert all(o.get("phase") != "Waiting" or "waiting" in o for o in got.objs)


async def test_a_present_layer_ends_present_when_the_summary_beats_kubelets_pulled(
        kube: FakeKube) -> None:
    """A pull whose base layer was already on the node: while kubelet pulls, that
    layer's AlreadyPresent reads as Pulling. The agent's Summary often arrives before
    kubelet's Pulled event; the stream then ends on the runtime's word, so every
    layer's last object is final. At dd35495 the base layer's last object stayed
    Pulling (a CI failure of test_long_pull_on_watch_path_and_plain_path, now
    follow_long_pull in tests/e2e/test_long_streams_e2e.py)."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                       "2026-01-01T00:00:01Z"))
    agent = ScriptedAgent()
    lines = agent.stream()
    async with running(kube, pod, agent, follow=True, granularity="layer") as (got, _):
        lines.send(progress("app", IMG, "AlreadyPresent", 4, 4, layer="sha256:base"),
                   progress("app", IMG, "Downloading", 2, 8, layer="sha256:top"))
        await until(lambda: any(o.get("layer") == "sha256:top" for o in got.objs))
        lines.send(progress("app", IMG, "Done", 8, 8, layer="sha256:top"),
                   done_summary("app", IMG, 12, 12))
        lines.end()
    last: dict[str, str] = {}
    for o in got.objs:
        if o.get("kind") == "Progress" and o.get("layer"):
            last[o["layer"]] = o["phase"]
    assert last == {"sha256:base": "AlreadyPresent", "sha256:top": "Done"}, got.objs
    assert [o["kind"] for o in got.finals()] == ["Summary"]
    assert got.objs[-1]["kind"] == "Summary"


async def test_kubelets_pulling_while_the_agent_stream_opens_is_not_missed(
        kube: FakeKube) -> None:
    """kubelet's Pulling event lands while the producer opens the agent's stream (after
    it read the pod, before it waits for the pod's next change). The stream must still
    show it: Pulling, not Pending until the bytes move. At dd35495 that event was
    skipped, and a pod waiting for the node's only slot never showed Waiting (a
    CI failure of test_other_tenants_pulls_are_a_count)."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    agent = ScriptedAgent()
    async with running(kube, pod, agent, follow=True) as (got, _):
        await until(lambda: len(agent.opened) == 1)  # inside open(): no stream queued yet
        kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                           "2026-01-01T00:00:01Z"))
        await asyncio.sleep(0.3)  # the pod watch has the event
        lines = agent.stream()
        lines.send(progress("app", IMG, "Waiting"))
        await until(lambda: got.phases()[-1:] == ["Pulling"], within=3)
        lines.send(progress("app", IMG, "Done", 5, 5),
                   done_summary("app", IMG, 5, 5))
        lines.end()
    assert got.phases()[-2:] == ["Pulling", "Done"]
