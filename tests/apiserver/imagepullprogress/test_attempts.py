"""kubelet's attempts at a failing pull, as its events and statuses reach the stream.

kubelet (pkg/kubelet/images EnsureImageExists, v1.37) emits per attempt: Pulling,
then for a failure 'Failed to pull image "x": <error>' and (kuberuntime) 'Error:
ErrImagePull', all within a moment when the registry answers "not found"; the pod's
next sync within its image back-off (10 s, doubling) emits BackOff and 'Error:
ImagePullBackOff'. Repeats update one Event (count, lastTimestamp); the container's
status (ErrImagePull / ImagePullBackOff) is written on its own, so it lags or leads.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .scripted import Lines, ScriptedAgent, done_summary, event, pod_object, progress
from .test_producer import running

IMG = "reg/app:1"
NOT_FOUND = (f'Failed to pull image "{IMG}": rpc error: code = NotFound desc = failed to '
             f'pull and unpack image "{IMG}": failed to resolve reference "{IMG}": '
             f'{IMG}: not found')


# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


class Kubelet:
    """kubelet's side of one pod: its deduplicated events and the container status."""

    def __init__(self, kube: FakeKube, pod: dict[str, Any]) -> None:
        self.kube, self.pod = kube, pod
        self.counts: dict[str, int] = {}

    def emit(self, reason: str, message: str, t: int) -> None:
        key = f"{reason}/{message}"
        n = self.counts[key] = self.counts.get(key, 0) + 1
        ev = event(self.pod, reason, "app", message, f"2026-01-01T00:00:{t:02d}Z", count=n,
                   name=f"p.{abs(hash(key)) % (1 << 60):x}")
        if reason == "Failed":
            ev["type"] = "Warning"
        self.kube.put("api/v1", "events", ev)

    def status(self, reason: str, message: str = "") -> None:
        self.pod["status"] = {"containerStatuses": [
            {"name": "app", "image": IMG, "imageID": "",
             "state": {"waiting": {"reason": reason, "message": message}}}]}
        self.kube.put("api/v1", "pods", self.pod)

    def fails(self, t: int) -> None:
        """One attempt, failing at once: its events reach the stream together."""
        self.emit("Pulling", f'Pulling image "{IMG}"', t)
        self.emit("Failed", NOT_FOUND, t)
        self.emit("Failed", "Error: ErrImagePull", t)

    def backs_off(self, t: int) -> None:
        self.emit("BackOff", f'Back-off pulling image "{IMG}"', t)
        self.emit("Failed", "Error: ImagePullBackOff", t)


class Agent(ScriptedAgent):
    """The agent after a failed pull: asked again before the next attempt's lease
    shows, it still says Failed (its memory of the lease that went without a record)."""

    async def open(self, method: str, path: str, **kw: Any) -> Any:
        if self.streams.empty() and path != "/v1/imagepulls":
            lines = Lines()
            lines.send(progress("app", IMG, "Failed", error="lease released"),
                       {"kind": "Error", "container": "app", "image": IMG,
                        "phase": "Failed", "error": "lease released"})
            lines.end()
            self.streams.put_nowait(lines)
        return await super().open(method, path, **kw)


def steps(objs: list[dict[str, Any]], container: str = "app") -> list[tuple[str, int]]:
    """(phase, attempt) of the container's objects, repeats collapsed."""
    out: list[tuple[str, int]] = []
    for o in objs:
        if o.get("kind") == "Progress" and o.get("container") == container:
            step = (o["phase"], o["attempt"])
            if not out or out[-1] != step:
                out.append(step)
    return out


async def reach(objs: list[dict[str, Any]], phase: str, attempt: int,
                container: str = "app") -> None:
    """Until the latest step is (phase, attempt); else fail saying the steps."""
    try:
        await until(lambda: steps(objs, container)[-1:] == [(phase, attempt)])
    except AssertionError:
        raise AssertionError(f"never reached {(phase, attempt)}: "
                             f"{steps(objs, container)}") from None


def attempt_one(kube: FakeKube) -> tuple[dict[str, Any], Kubelet, Agent, Lines]:
    """A pod whose image kubelet starts pulling (attempt 1), and the agent's first
    stream for it."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    k = Kubelet(kube, pod)
    agent = Agent()
    first = agent.stream()
    k.emit("Pulling", f'Pulling image "{IMG}"', 1)
    return pod, k, agent, first


async def first_attempt_fails(k: Kubelet, first: Lines, objs: list[dict[str, Any]]) -> None:
    """Attempt 1 as kubelet and the agent show it: Pulling, the image not found (the
    agent's lease released), then the first 10 s back-off."""
    first.send(progress("app", IMG, "Waiting"))
    await reach(objs, "Pulling", 1)
    k.emit("Failed", NOT_FOUND, 1)
    k.emit("Failed", "Error: ErrImagePull", 1)
    k.status("ErrImagePull", "not found")
    first.send(progress("app", IMG, "Failed", error="lease released"),
               {"kind": "Error", "container": "app", "image": IMG, "phase": "Failed",
                "error": "lease released"})
    first.end()
    await reach(objs, "Failed", 1)
    k.backs_off(2)
    k.status("ImagePullBackOff", f'Back-off pulling image "{IMG}": ErrImagePull')
    await reach(objs, "BackOff", 1)


async def test_each_attempt_has_its_own_pulling_and_attempts_move_only_then(
        kube: FakeKube) -> None:
    """At b8a55c6: BackOff with attempt 2 while the first back-off ran (the status still
    said ImagePullBackOff when attempt 2's Failed came in), and attempt 2 never showed
    Pulling (its Pulling and Failed came together)."""
    pod, k, agent, first = attempt_one(kube)
    async with running(kube, pod, agent, follow=True) as (got, _):
        await first_attempt_fails(k, first, got.objs)
        # 10-15 s later, attempt 2 fails at once; the status is still the back-off's
        k.emit("Pulling", f'Pulling image "{IMG}"', 13)
        k.emit("Failed", NOT_FOUND, 13)
        k.emit("Failed", "Error: ErrImagePull", 13)
        await reach(got.objs, "Failed", 2)
        k.status("ErrImagePull", "not found")
        k.backs_off(14)
        k.status("ImagePullBackOff", f'Back-off pulling image "{IMG}": ErrImagePull')
        await reach(got.objs, "BackOff", 2)
        k.backs_off(27)  # a sync still within the 20 s back-off
        # the image was pushed meanwhile: attempt 3 pulls it
        pull = agent.stream()
        k.emit("Pulling", f'Pulling image "{IMG}"', 35)
        await reach(got.objs, "Pulling", 3)
        pull.send(progress("app", IMG, "Waiting"), progress("app", IMG, "Resolving"))
        pull.send(progress("app", IMG, "Downloading", 3, 12))
        await reach(got.objs, "Downloading", 3)
        k.emit("Pulled", f'Successfully pulled image "{IMG}" in 4s', 39)
        pull.send(progress("app", IMG, "Done", 12, 12), done_summary("app", IMG, 12, 12))
        pull.end()
    assert steps(got.objs) == [
        ("Pulling", 1), ("Failed", 1), ("BackOff", 1),
        ("Pulling", 2), ("Failed", 2), ("BackOff", 2),
        ("Pulling", 3), ("Downloading", 3), ("Done", 3)], steps(got.objs)
    backoffs = [o["backOffSeconds"] for o in got.objs if o.get("phase") == "BackOff"]
    assert backoffs and sorted(set(backoffs)) == [10, 20], backoffs
    assert [o["kind"] for o in got.finals()] == ["Summary"]


async def test_an_attempt_whose_pulling_was_not_seen_still_starts_pulling(
        kube: FakeKube) -> None:
    """Attempt 2's Failed reaches the stream before its Pulling (or kubelet's spam
    filter dropped that Pulling): the stream still shows attempt 2 start with Pulling,
    then fail. At b8a55c6 attempt 2 went from BackOff straight to BackOff."""
    pod, k, agent, first = attempt_one(kube)
    async with running(kube, pod, agent, follow=True) as (got, task):
        await first_attempt_fails(k, first, got.objs)
        k.emit("Failed", NOT_FOUND, 13)
        k.emit("Failed", "Error: ErrImagePull", 13)
        await reach(got.objs, "Failed", 2)
        k.emit("Pulling", f'Pulling image "{IMG}"', 13)  # late, or never
        k.backs_off(14)
        await reach(got.objs, "BackOff", 2)
        task.cancel()
    assert steps(got.objs) == [("Pulling", 1), ("Failed", 1), ("BackOff", 1),
                               ("Pulling", 2), ("Failed", 2), ("BackOff", 2)]


async def test_the_image_row_of_a_layer_stream_ends_with_the_image(kube: FakeKube) -> None:
    """At layer granularity the object sent before the manifest was known (layer "")
    is the image's row: it ends Done with the image. In a real kubelet's run at
    b8a55c6 it went Pulling -> Resolving when kubelet's Pulled came, and stayed."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    k = Kubelet(kube, pod)
    k.emit("Pulling", f'Pulling image "{IMG}"', 1)
    agent = Agent()
    lines = agent.stream()
    async with running(kube, pod, agent, follow=True, granularity="layer") as (got, _):
        lines.send(progress("app", IMG, "Resolving"))
        await reach(got.objs, "Pulling", 1)
        lines.send(progress("app", IMG, "Downloading", 3, 8, layer="sha256:top"),
                   progress("app", IMG, "AlreadyPresent", 4, 4, layer="sha256:base"))
        await until(lambda: any(o.get("layer") == "sha256:base" for o in got.objs))
        k.emit("Pulled", f'Successfully pulled image "{IMG}" in 3s', 4)
        await until(lambda: [o["phase"] for o in got.objs if o.get("kind") == "Progress"
                             and not o["layer"]][-1:] == ["Done"])
        lines.send(progress("app", IMG, "Done", 8, 8, layer="sha256:top"),
                   done_summary("app", IMG, 8, 8))
        lines.end()
    rows = [o["phase"] for o in got.objs if o.get("kind") == "Progress" and not o["layer"]]
    assert rows == ["Pulling", "Done"], rows
    last = {o["layer"]: o["phase"] for o in got.objs if o.get("kind") == "Progress"}
    assert last == {"": "Done", "sha256:top": "Done", "sha256:base": "AlreadyPresent"}, last
