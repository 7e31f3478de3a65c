"""When the pod's own pull began, from kubelet's events, passed to the agent so that a
snapshot after the pull says Done for the layers that pull brought (as the stream that
watched it did), and AlreadyPresent for those that were on the node before."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggapi import wire
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.imagepullprogress.pullstate import PULL_BEGAN_MARGIN, views
from aggapi.auth.capability import ContainerRef
from tests.framework.fakekube import FakeKube

from .scripted import ScriptedAgent, done_summary, event, pod_object, progress
from .test_producer import running

IMG = "reg/app:1"
APP = ("container", "app")
C = (ContainerRef("app", IMG),)
T = "2026-01-01T00:00:10Z"
T_S = datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp()
PULLED = f'Successfully pulled image "{IMG}" in 2.3s (4.1s including waiting). ' \
         "Image size: 123 bytes."

pytestmark = pytest.mark.usefixtures("quick_retry")


def ev(reason: str, message: str, t: str, *, name: str = "p.x", count: int = 1
       ) -> dict[str, Any]:
    return {"reason": reason, "message": message, "lastTimestamp": t, "count": count,
            "metadata": {"name": name},
            "involvedObject": {"fieldPath": "spec.containers{app}"}}


def began(*evs: dict[str, Any]) -> float | None:
    pod = {"spec": {"nodeName": "n1"}, "status": {}}
    return views(pod, list(evs), C)[APP].pull_began


def nanos(t: float) -> str:
    return f"p.{int(t * 1e9):x}"


def test_the_pull_began_its_duration_before_kubelets_pulled() -> None:
    """Not at Pulling: that includes the wait for a pull slot, while other pulls may
    bring a shared layer (the stream that watched said AlreadyPresent for it)."""
    pulling = ev("Pulling", f'Pulling image "{IMG}"', "2026-01-01T00:00:05Z")
    # client-go's name gives the Pulled event's time within its second.
    got = began(pulling, ev("Pulled", PULLED, T, name=nanos(T_S + 0.25)))
    assert got == pytest.approx(T_S + 0.25 - 2.3 - PULL_BEGAN_MARGIN)
    # A repeated event's name is its first time: the whole second, earlier.
    got = began(pulling, ev("Pulled", PULLED, T, name=nanos(T_S + 0.25), count=2))
    assert got == pytest.approx(T_S - 2.3 - PULL_BEGAN_MARGIN)


@pytest.mark.parametrize(("took", "seconds"), [
    ("1m2.5s", 62.5), ("345ms", 0.345), ("1h0m0s", 3600.0), ("1.5µs", 1.5e-6),
    ("2s", 2.0)])
def test_kubelets_durations_are_read_as_go_prints_them(took: str, seconds: float) -> None:
    msg = f'Successfully pulled image "{IMG}" in {took} ({took} including waiting). ' \
          "Image size: 1 bytes."
    assert began(ev("Pulled", msg, T)) == pytest.approx(T_S - seconds - PULL_BEGAN_MARGIN)


def test_without_a_duration_the_pull_began_by_kubelets_pulling() -> None:
    """kubelets before 1.25 said only 'Successfully pulled image X'."""
    got = began(ev("Pulling", f'Pulling image "{IMG}"', "2026-01-01T00:00:05Z"),
                ev("Pulled", f'Successfully pulled image "{IMG}"', T))
    assert got == pytest.approx(T_S - 5 - PULL_BEGAN_MARGIN)
    assert began(ev("Pulled", f'Successfully pulled image "{IMG}"', T)) is None


@pytest.mark.parametrize("took", ["999999h", "1e9s", "-2s", "", "2.3", "2s2s2s" * 20])
def test_a_duration_kubelet_would_not_print_is_not_believed(took: str) -> None:
    msg = f'Successfully pulled image "{IMG}" in {took} ({took} including waiting).'
    assert began(ev("Pulled", msg, T)) is None


def test_an_image_kubelet_found_present_has_no_pull() -> None:
    msg = f'Container image "{IMG}" already present on machine'
    assert began(ev("Pulled", msg, T)) is None


@given(st.text(max_size=300))
def test_any_pulled_message_gives_a_start_no_later_than_the_event(message: str) -> None:
    got = began(ev("Pulled", "Successfully pulled image " + message, T))
    assert got is None or 0 < got <= T_S


def test_the_merger_names_each_container_whose_pull_kubelet_made() -> None:
    cs = (ContainerRef("app", IMG), ContainerRef("side", "reg/side:1"),
          ContainerRef("again", IMG))
    m = Merger(cs)
    pod = pod_object(containers=(("app", IMG), ("side", "reg/side:1"), ("again", IMG)))
    m.update(pod, [
        event(pod, "Pulled", "app", PULLED, T),
        event(pod, "Pulled", "side", 'Container image "reg/side:1" already present on '
              "machine", T),
        event(pod, "Pulled", "again", f'Container image "{IMG}" already present on '
              "machine", T)])
    assert m.pulls_began() == {0: pytest.approx(T_S - 2.3 - PULL_BEGAN_MARGIN)}


@pytest.mark.parametrize("follow", [False, True])
async def test_the_agent_is_told_when_the_pods_pull_began(kube: FakeKube,
                                                          follow: bool) -> None:
    """At 44c707c the agent was asked without it, and said AlreadyPresent for every
    layer of a finished pull."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                       "2026-01-01T00:00:05Z"))
    kube.put("api/v1", "events", event(pod, "Pulled", "app", PULLED, T))
    agent = ScriptedAgent()
    lines = agent.stream()
    lines.send(progress("app", IMG, "AlreadyPresent", 4, 4, layer="sha256:base"),
               progress("app", IMG, "Done", 8, 8, layer="sha256:top"),
               done_summary("app", IMG, 8, 8))
    lines.end()
    async with running(kube, pod, agent, follow=follow, granularity="layer") as (got, _):
        pass
    params = agent.opened[0]["params"]
    assert params["granularity"] == "layer"
    sent = json.loads(params[wire.PARAM_PULLS_BEGAN])
    assert sent == {"0": int((T_S - 2.3 - PULL_BEGAN_MARGIN) * 1000)}
    assert wire.PARAM_PULLS_BEGAN not in agent.opened[0]["query"]
    last = {o["layer"]: o["phase"] for o in got.objs if o.get("kind") == "Progress"}
    assert last == {"sha256:base": "AlreadyPresent", "sha256:top": "Done"}


async def test_no_start_while_kubelet_pulls(kube: FakeKube) -> None:
    """A pull under way is the live stream's, which knows its own start."""
    pod = pod_object()
    kube.put("api/v1", "pods", pod)
    kube.put("api/v1", "events", event(pod, "Pulling", "app", f'Pulling image "{IMG}"',
                                       "2026-01-01T00:00:05Z"))
    agent = ScriptedAgent()
    lines = agent.stream()
    lines.send(progress("app", IMG, "Downloading", 1, 8))
    lines.end()
    async with running(kube, pod, agent, follow=False) as (_, _):
        pass
    assert wire.PARAM_PULLS_BEGAN not in agent.opened[0]["params"]
