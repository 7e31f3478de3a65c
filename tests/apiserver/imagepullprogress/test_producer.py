"""The Producer's stream as kubelet lives a pull: the pod and its events come from
the fake kube-apiserver through the real PodWatch; the agent is scripted.

Here: following and snapshots, what they end with. Tenants: test_producer_tenants.py;
the agent's word against kubelet's: test_producer_agent_kubelet.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .producerrun import IMG, running
from .scripted import Collected, ScriptedAgent, done_summary, event, pod_object, progress

# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


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
