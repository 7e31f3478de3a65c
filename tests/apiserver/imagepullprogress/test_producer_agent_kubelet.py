"""The Producer's stream where the agent's word and kubelet's differ or race: an agent
failure kubelet has not confirmed or contradicts, an always-repull of a present image,
a Summary before kubelet's Pulled, kubelet's Pulling while the agent stream opens."""

from __future__ import annotations

import asyncio

import pytest

from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .producerrun import IMG, running
from .scripted import ScriptedAgent, done_summary, event, pod_object, progress

# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


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
