"""A real kubelet's failing pull, replayed through the Producer: the events and
container statuses recorded on the harness's kubelet (recorded/kubelet-1.37-backoff.json)
reach the fake kube-apiserver in the order a watch saw them, in the bursts kubelet
wrote them (Pulling, Failed and 'Error: ErrImagePull' within 20 ms; the status a step
behind). After each burst the stream must say where kubelet is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.framework.fakekube import FakeKube

from .scripted import Lines, ScriptedAgent, done_summary, pod_object, progress
from .test_attempts import reach, steps
from .test_producer import running

RECORDED = json.loads((Path(__file__).parent / "recorded" / "kubelet-1.37-backoff.json")
                      .read_text())
IMG = RECORDED["image"]


# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


class Agent(ScriptedAgent):
    """Asked between attempts, the agent says the last pull failed."""

    async def open(self, method: str, path: str, **kw: Any) -> Any:
        if self.streams.empty() and path != "/v1/imagepulls":
            lines = Lines()
            lines.send(progress("c", IMG, "Failed", error="lease released"),
                       {"kind": "Error", "container": "c", "image": IMG, "phase": "Failed",
                        "error": "lease released"})
            lines.end()
            self.streams.put_nowait(lines)
        return await super().open(method, path, **kw)


def bursts(recorded: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Steps kubelet wrote within 0.1 s of each other."""
    out: list[list[dict[str, Any]]] = []
    for s in recorded:
        if out and s["at"] - out[-1][0]["at"] < 0.1:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def event_of(pod: dict[str, Any], e: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": e["name"], "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               "fieldPath": e["fieldPath"]},
            "reason": e["reason"], "message": e["message"], "type": e["type"],
            "count": e["count"], "firstTimestamp": e["firstTimestamp"],
            "lastTimestamp": e["lastTimestamp"],
            "source": {"component": "kubelet", "host": pod["spec"]["nodeName"]}}


def expected(burst: list[dict[str, Any]], attempt: int) -> tuple[int, tuple[str, int] | None]:
    """kubelet's attempt after ``burst``, and the step the stream must show then."""
    reasons = []
    for s in burst:
        e = s.get("event")
        if e is None:
            continue
        if e["reason"] == "Pulling":
            attempt = e["count"]
        if e["reason"] == "Failed" and not e["message"].startswith("Error: "):
            reasons.append("Failed")
        elif e["reason"] in ("Pulling", "BackOff", "Pulled"):
            reasons.append(e["reason"])
    for phase in ("BackOff", "Failed", "Pulling"):
        if phase in reasons:
            return attempt, (phase, attempt)
    return attempt, None


async def test_a_real_kubelets_failing_pull_goes_attempt_by_attempt(kube: FakeKube) -> None:
    """At b8a55c6 this replay showed BackOff with attempt 2 while the status still
    said the first back-off, and attempt 2 without its Pulling."""
    pod = pod_object(containers=(("c", IMG),))
    kube.put("api/v1", "pods", pod)
    agent = Agent()
    first = agent.stream()
    first.send(progress("c", IMG, "Waiting"))
    attempt = 0
    async with running(kube, pod, agent, follow=True) as (got, _):
        for burst in bursts(RECORDED["steps"]):
            pulled = any((s.get("event") or {}).get("reason") == "Pulled" for s in burst)
            if pulled:
                break
            if any((s.get("event") or {}).get("reason") == "Pulling"
                   and s["event"]["count"] == 4 for s in burst):
                pull = agent.stream()  # the image is there now: this attempt pulls it
            for s in burst:
                if "event" in s:
                    kube.put("api/v1", "events", event_of(pod, s["event"]))
                else:
                    pod["status"] = {"containerStatuses": s["containerStatuses"]}
                    kube.put("api/v1", "pods", pod)
            attempt, step = expected(burst, attempt)
            if step is not None:
                await reach(got.objs, *step, container="c")
            if step == ("Failed", 1):  # then the agent sees the lease go, no image
                first.send(progress("c", IMG, "Failed", error="lease released"),
                           {"kind": "Error", "container": "c", "image": IMG,
                            "phase": "Failed", "error": "lease released"})
                first.end()
        pull.send(progress("c", IMG, "Downloading", 1 << 20, 4 << 20))
        await reach(got.objs, "Downloading", 4, container="c")
        for s in burst:
            if "event" in s:
                kube.put("api/v1", "events", event_of(pod, s["event"]))
        pull.send(progress("c", IMG, "Done", 4 << 20, 4 << 20),
                  done_summary("c", IMG, 4 << 20, 4 << 20))
        pull.end()
    want = [(p, n) for n in (1, 2, 3) for p in ("Pulling", "Failed", "BackOff")]
    assert steps(got.objs, "c") == [("Pending", 0), *want, ("Pulling", 4), ("Downloading", 4),
                                    ("Done", 4)]
    assert [o["kind"] for o in got.finals()] == ["Summary"]
