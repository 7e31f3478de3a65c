"""Image pulls as Prometheus metrics: what the node's containerd pulls, per registry.

The progress poller already reads containerd's leases and ingests; this keeps it
polling while the agent runs (one internal subscription, not counted as a stream)
and turns each NodeState into the pull families of AgentMetrics. Labels are the
registry host alone (the node is the scrape target's own label): pods and images
are unbounded, so they are never labels. Registry hosts are label values as
``aggapi.registrylabels`` makes them (capped; the apiserver's fleet view uses the same).

A pull is a containerd lease (PullState). Its bytes count as they land (its progress
only grows; a restarted layer that goes back counts again only past its high mark),
and its duration and size are observed when the lease ends. A pull is stalled when
its progress has not moved for ``stall_after`` seconds while it had layers to fetch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from aggapi import tasks
from aggapi.agent.kubeletconfig import PullLimits
from aggapi.agent.metrics import AgentMetrics
from aggapi.agent.progress.model import NodeState, PullState
from aggapi.agent.progress.poller import ProgressPoller
from aggapi.registrylabels import UNKNOWN, RegistryLabels, host_of_repositories

log = logging.getLogger(__name__)

LIMITS_EVERY = 30.0  # seconds between reads of kubelet's pull limits (its config file)
Limits = Callable[[], Awaitable[PullLimits]]


def registry_of(pull: PullState) -> str:
    """The host of the pull's first repository ("host/repo" from containerd's
    distribution-source labels, which carry no port), lower-cased."""
    return host_of_repositories(pull.repositories)


@dataclass
class _Seen:
    registry: str
    started_at: float
    high: int = 0  # the most bytes counted for this pull
    total: int | None = None
    moved_at: float = 0.0  # monotonic time its progress last grew


class PullTracker:
    """Feeds AgentMetrics' pull families from successive NodeStates (one per poll)."""

    def __init__(self, metrics: AgentMetrics, *, stall_after: float = 60.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.metrics = metrics
        self.stall_after = stall_after
        self._clock = clock
        self._mono = monotonic
        self._pulls: dict[str, _Seen] = {}  # lease -> what was seen of it
        self._label = RegistryLabels()
        self._shown: set[str] = set()  # registries whose gauges were last set non-zero

    def observe(self, state: NodeState) -> None:
        if state.pulls is None:  # the backend cannot see pulls (CRI only) or failed
            return
        m, now = self.metrics, self._mono()
        in_flight: dict[str, int] = {}
        stalled: dict[str, int] = {}
        rate: dict[str, float] = {}
        live = set()
        for pull in state.pulls:
            live.add(pull.lease)
            seen = self._pulls.get(pull.lease)
            if seen is None:
                seen = self._pulls[pull.lease] = _Seen(self._label(registry_of(pull)),
                                                       pull.started_at, moved_at=now)
            elif seen.registry == UNKNOWN and pull.repositories:
                seen.registry = self._label(registry_of(pull))  # its tag resolved
            reg = seen.registry
            in_flight[reg] = in_flight.get(reg, 0) + 1
            if pull.total is not None:
                seen.total = pull.total
            if pull.progress is not None and pull.progress > seen.high:
                m.pull_bytes.labels(reg).inc(pull.progress - seen.high)
                seen.high, seen.moved_at = pull.progress, now
            if pull.bytes_per_second:
                rate[reg] = rate.get(reg, 0.0) + pull.bytes_per_second
            left = None if seen.total is None else seen.total - seen.high
            if now - seen.moved_at >= self.stall_after and left != 0:
                stalled[reg] = stalled.get(reg, 0) + 1
        for lease in list(self._pulls):
            if lease not in live:
                self._ended(self._pulls.pop(lease))
        # A registry's gauges drop to 0 once its last pull ends (then stay, unchanged).
        for reg in self._shown | in_flight.keys():
            m.pulls_in_flight.labels(reg).set(in_flight.get(reg, 0))
            m.pulls_stalled.labels(reg).set(stalled.get(reg, 0))
            m.pull_link_rate.labels(reg).set(rate.get(reg, 0.0))
        self._shown = set(in_flight)

    def now(self) -> float:
        return self._mono()

    def slots(self, limits: PullLimits) -> None:
        slots = limits.parallel_slots
        unlimited = limits.known and slots is None
        self.metrics.pull_slots.set(
            math.inf if unlimited else math.nan if slots is None else slots)

    def _ended(self, seen: _Seen) -> None:
        m = self.metrics
        m.pull_seconds.labels(seen.registry).observe(
            max(self._clock() - seen.started_at, 0.0))
        if seen.total:
            m.pull_size.labels(seen.registry).observe(seen.total)


def following(poller: ProgressPoller, tracker: PullTracker, limits: Limits | None = None
              ) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context: :func:`run` while the metrics app is up."""
    async def ctx(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run(poller, tracker, limits), name="pull-metrics")
        yield
        await tasks.cancel(task)
    return ctx


async def run(poller: ProgressPoller, tracker: PullTracker, limits: Limits | None = None
              ) -> None:
    """Keep the poller polling and feed every state it publishes to ``tracker``; read
    kubelet's pull slots (``limits``) at most every LIMITS_EVERY seconds."""
    sub = poller.subscribe((), internal=True)
    read_at = -LIMITS_EVERY
    try:
        while True:
            state = await sub.next()
            try:
                if state is not None:
                    tracker.observe(state)
                if limits is not None and tracker.now() - read_at >= LIMITS_EVERY:
                    read_at = tracker.now()
                    tracker.slots(await limits())
            except Exception:  # metrics must never take the agent down
                log.exception("pull metrics: a state could not be counted")
    finally:
        sub.close()
