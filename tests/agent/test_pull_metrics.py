"""The pull families of the agent's metrics (aggapi.agent.pullmetrics) from
successive node states: bytes that only grow, gauges per registry host that fall back
to 0, a capped label set, stalls after the configured time, and durations and sizes
observed once a pull's lease ends. The real-containerd check is in
tests/agent/test_agent_integration.py."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st

from aggapi.agent.kubeletconfig import PullLimits
from aggapi.agent.metrics import AgentMetrics
from aggapi.agent.progress.model import DOWNLOADING, NodeState, PullState
from aggapi.agent.progress.poller import ProgressPoller
from aggapi.agent.pullmetrics import PullTracker, registry_of, run
from aggapi.registrylabels import MAX_REGISTRIES, OTHER


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pull(lease: str, progress: int | None, total: int | None = 100, *,
         repo: str = "Registry.example:5000/app", rate: float | None = None,
         started: float = 990.0) -> PullState:
    return PullState(lease, started, DOWNLOADING, (repo,) if repo else (), (), "",
                     progress, total, rate)


def node(*pulls: PullState) -> NodeState:
    return NodeState("containerd", {}, tuple(pulls))


# containerd names the host without its port (url.Hostname() in its distribution-source
# labels); a port, were one there, would go as in an image's host (registrylabels).
def value(m: AgentMetrics, name: str, registry: str = "registry.example") -> float:
    return m.value(name, registry=registry)


def tracker() -> tuple[AgentMetrics, PullTracker, Clock]:
    m, clock = AgentMetrics(), Clock()
    return m, PullTracker(m, stall_after=30, clock=clock, monotonic=clock), clock


def test_registry_is_the_first_repositorys_host() -> None:
    assert registry_of(pull("l", 0, repo="Docker.io/library/busybox")) == "docker.io"
    assert registry_of(pull("l", 0, repo="")) == "unknown"


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=30))
def test_bytes_count_each_byte_once_whatever_the_progress_does(seq: list[int]) -> None:
    m, t, _ = tracker()
    for p in seq:
        t.observe(node(pull("l1", p, 10_000)))
    assert value(m, "aggapi_agent_image_pull_bytes_total") == max(seq)


def test_gauges_follow_the_pulls_and_fall_to_zero() -> None:
    m, t, clock = tracker()
    t.observe(node(pull("a", 10, rate=5.0), pull("b", 0, rate=2.0),
                   pull("c", 1, repo="docker.io/library/x")))
    assert value(m, "aggapi_agent_image_pulls_in_flight") == 2
    assert value(m, "aggapi_agent_image_pull_bytes_per_second") == 7.0
    assert value(m, "aggapi_agent_image_pulls_in_flight", "docker.io") == 1
    clock.now = 1010.0
    t.observe(node(pull("a", 100, 100)))  # b and c ended
    assert value(m, "aggapi_agent_image_pulls_in_flight") == 1
    assert value(m, "aggapi_agent_image_pulls_in_flight", "docker.io") == 0
    assert value(m, "aggapi_agent_image_pull_duration_seconds_count") == 1
    assert value(m, "aggapi_agent_image_pull_duration_seconds_sum") == 20.0  # 1010 - 990
    assert value(m, "aggapi_agent_image_pull_size_bytes_sum") == 100
    t.observe(node())
    assert value(m, "aggapi_agent_image_pulls_in_flight") == 0
    assert value(m, "aggapi_agent_image_pull_bytes_per_second") == 0
    assert value(m, "aggapi_agent_image_pull_duration_seconds_count") == 2
    assert value(m, "aggapi_agent_image_pull_bytes_total") == 100


def test_a_pull_stalls_when_its_bytes_stop_for_the_set_time() -> None:
    m, t, clock = tracker()
    t.observe(node(pull("a", 10)))
    clock.now += 29
    t.observe(node(pull("a", 10)))
    assert value(m, "aggapi_agent_image_pulls_stalled") == 0
    clock.now += 1
    t.observe(node(pull("a", 10)))
    assert value(m, "aggapi_agent_image_pulls_stalled") == 1
    t.observe(node(pull("a", 11)))  # a byte moves: no longer stalled
    assert value(m, "aggapi_agent_image_pulls_stalled") == 0
    clock.now += 60
    t.observe(node(pull("a", 100, 100)))  # all there (unpacking): not a stall
    clock.now += 60
    t.observe(node(pull("a", 100, 100)))
    assert value(m, "aggapi_agent_image_pulls_stalled") == 0


def test_registry_labels_are_capped() -> None:
    m, t, _ = tracker()
    hosts = [f"r{i}.example" for i in range(MAX_REGISTRIES + 5)]
    t.observe(node(*(pull(h, 1, repo=f"{h}/app") for h in hosts)))
    assert value(m, "aggapi_agent_image_pulls_in_flight", OTHER) == 5
    families = {s.labels.get("registry") for f in m.registry.collect()
                if f.name == "aggapi_agent_image_pulls_in_flight" for s in f.samples}
    assert len(families) == MAX_REGISTRIES + 1


def test_a_pull_resolving_its_tag_gets_its_registry_later() -> None:
    m, t, _ = tracker()
    t.observe(node(pull("a", None, None, repo="")))
    assert value(m, "aggapi_agent_image_pulls_in_flight", "unknown") == 1
    t.observe(node(pull("a", 5)))
    assert value(m, "aggapi_agent_image_pulls_in_flight", "unknown") == 0
    assert value(m, "aggapi_agent_image_pulls_in_flight") == 1


def test_a_backend_that_cannot_see_pulls_changes_nothing() -> None:
    m, t, _ = tracker()
    t.observe(node(pull("a", 10)))
    t.observe(NodeState("cri", {}, None))
    assert value(m, "aggapi_agent_image_pulls_in_flight") == 1


class Backend:
    name = "fake"

    def __init__(self) -> None:
        self.polls = 0

    async def observe(self, watched: Iterable[str]) -> NodeState:
        self.polls += 1
        return node(pull("a", self.polls * 10, 1000))

    def forget(self) -> None:
        pass

    async def present_images(self) -> tuple[str, ...] | None:
        return None


async def test_run_keeps_the_poller_polling_without_counting_a_stream() -> None:
    m, t, _ = tracker()
    backend = Backend()
    poller = ProgressPoller(backend, interval=0.01)
    task = asyncio.create_task(run(poller, t))
    try:
        for _ in range(1000):  # polls every 10 ms: 50 bytes after 5 of them
            if value(m, "aggapi_agent_image_pull_bytes_total") >= 50:
                break
            await asyncio.sleep(0.01)
        assert poller.running and poller.subscribers == 0
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await poller.close()
    assert not poller.running


async def test_kubelets_slots_are_read_beside_the_pulls() -> None:
    m, t, _ = tracker()
    reads: list[PullLimits] = [PullLimits(serialize_image_pulls=False,
                                          max_parallel_image_pulls=3)]

    async def limits() -> PullLimits:
        return reads[-1]

    poller = ProgressPoller(Backend(), interval=0.01)
    task = asyncio.create_task(run(poller, t, limits))
    try:
        for _ in range(1000):
            if m.value("aggapi_agent_image_pull_slots") == 3:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await poller.close()
    assert m.value("aggapi_agent_image_pull_slots") == 3
    t.slots(PullLimits(serialize_image_pulls=True))
    assert m.value("aggapi_agent_image_pull_slots") == 1
    t.slots(PullLimits(serialize_image_pulls=False))
    assert m.value("aggapi_agent_image_pull_slots") == math.inf
    t.slots(PullLimits(serialize_image_pulls=None, error="unreadable"))
    assert math.isnan(m.value("aggapi_agent_image_pull_slots"))
