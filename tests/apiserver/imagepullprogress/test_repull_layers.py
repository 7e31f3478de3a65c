"""A re-pull of a tag that moved (imagePullPolicy Always): the stream shows the new
image's layers only. The agent's objects are what it sends in that re-pull: first
the old record's layers (present), then the new manifest's (each layer object names
its manifest)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .scripted import ScriptedAgent, event, pod_object, progress
from .test_producer import running

IMG = "reg/app:1"
OLD, NEW = "sha256:" + "1" * 64, "sha256:" + "2" * 64  # the two manifests
BASE, GONE, FRESH = "sha256:base", "sha256:gone", "sha256:fresh"  # layers


# conftest.py: the fake kube-apiserver, and agent retries made quick.
pytestmark = pytest.mark.usefixtures("quick_retry")


def layer(digest: str, manifest: str, phase: str, prog: int, total: int) -> dict[str, Any]:
    return {**progress("app", IMG, phase, prog, total, layer=digest), "manifest": manifest}


def summary(phase: str) -> dict[str, Any]:
    return {"kind": "Summary", "phase": phase, "progress": None, "total": None,
            "images": [{"container": "app", "image": IMG, "phase": phase}]}


RECORD = (layer(BASE, OLD, "AlreadyPresent", 4, 4), layer(GONE, OLD, "AlreadyPresent", 1, 1))


async def test_a_moved_tags_repull_shows_only_the_new_images_layers(kube: FakeKube) -> None:
    """At b8a55c6 the old image's layer that the new one lacks was listed Pending, then
    Pulling, then AlreadyPresent (issue 37)."""
    pod = pod_object()
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    kube.put("api/v1", "pods", pod)
    agent = ScriptedAgent()
    first = agent.stream()
    first.send(*RECORD, summary("AlreadyPresent"))
    first.end()
    async with running(kube, pod, agent, follow=True, granularity="layer") as (got, _):
        await until(lambda: len(agent.opened) >= 2)
        assert got.phases() == ["Pending"]  # the image, not the record's layers
        kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                           "2026-01-01T00:00:01Z"))
        again = agent.stream()  # asked again: still the old record (no lease seen yet)
        again.send(*RECORD, summary("AlreadyPresent"))
        again.end()
        await until(lambda: got.phases()[-1:] == ["Pulling"])
        pull = agent.stream()  # the pull's lease and its new manifest
        pull.send(layer(BASE, NEW, "AlreadyPresent", 4, 4), layer(FRESH, NEW, "Waiting", 0, 6))
        await until(lambda: any(o.get("layer") == FRESH for o in got.objs))
        pull.send(layer(FRESH, NEW, "Downloading", 3, 6))
        pull.send(layer(FRESH, NEW, "Done", 6, 6), summary("Done"))
        pull.end()
    layers = {o["layer"] for o in got.objs if o.get("kind") == "Progress" and o["layer"]}
    assert layers == {BASE, FRESH}, [(o.get("layer"), o.get("phase")) for o in got.objs]
    last = {o["layer"]: o["phase"] for o in got.objs if o.get("kind") == "Progress"}
    assert last == {"": "Done", BASE: "AlreadyPresent", FRESH: "Done"}, last
    assert [o["kind"] for o in got.finals()] == ["Summary"]
    assert got.objs[-1]["kind"] == "Summary" and got.objs[-1]["phase"] == "Done"


async def test_an_unmoved_tags_repull_shows_its_layers_once_kubelet_has_it(
        kube: FakeKube) -> None:
    """The tag did not move: the re-pull finds every layer present. Its layers show
    once kubelet says it has the image, all AlreadyPresent."""
    pod = pod_object()
    pod["spec"]["containers"][0]["imagePullPolicy"] = "Always"
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                       "2026-01-01T00:00:01Z"))
    agent = ScriptedAgent()
    first = agent.stream()
    first.send(*RECORD, summary("AlreadyPresent"))
    first.end()
    async with running(kube, pod, agent, follow=True, granularity="layer") as (got, _):
        await until(lambda: got.phases() == ["Pulling"] and len(agent.opened) >= 2)
        assert not any(o.get("layer") for o in got.objs)
        again = agent.stream()
        kube.put("api/v1", "events", event(
            pod, "Pulled", "app", f'Successfully pulled image "{IMG}" in 1s',
            "2026-01-01T00:00:02Z"))
        again.send(*RECORD, summary("AlreadyPresent"))
        again.end()
    last = {o["layer"]: o["phase"] for o in got.objs if o.get("kind") == "Progress"}
    assert last == {"": "Done", BASE: "AlreadyPresent", GONE: "AlreadyPresent"}, last
    assert [o["kind"] for o in got.finals()] == ["Summary"]
