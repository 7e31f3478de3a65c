"""The fleet's image pulls per registry host, from the collections, as gauges on the
leader's /metrics (``--fleet-metrics``).

Each agent exports its own node's pulls; only the replica that computes the
collections sees every node at once: pulls in flight, their download rate, the nodes
pulling and the images waiting for a kubelet pull slot, per registry host (label
values as the agents make them, ``aggapi.registrylabels``, so the two join on
``registry``). A scrape is a use of the NodeImagePull collection, as a list is: the
first one starts its feeds (every node's view, the cluster's pods and events), and
they run while scrapes keep coming (``HOLD``). The other replicas export no fleet
series, so a sum over replicas counts each pull once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aggapi.apiserver.collections.feeds import NodeFeed
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.election import Election
from aggapi.apiserver.metrics import Metrics
from aggapi.apiserver.shared import Shared
from aggapi.registrylabels import RegistryLabels, host_of_image, registry_of
from aggapi.status import StatusError

HOLD = 300.0  # seconds the feeds stay up after the last scrape
READY_WAIT = 5.0  # seconds a scrape waits for a starting feed (a scrape times out at 10)


@dataclass
class RegistryFigures:
    in_flight: int = 0
    bytes_per_second: float = 0.0
    nodes: set[str] = field(default_factory=set)
    waiting: int = 0


def fleet_view(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
               label: RegistryLabels) -> dict[str, RegistryFigures]:
    """Per registry label: NodeImagePulls' pulls (in flight, bytes/s, nodes) and
    PodImagePulls' images waiting for a slot (an image named by several containers of
    one pod waits once: kubelet pulls it once)."""
    out: dict[str, RegistryFigures] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name") or "")
        for pull in (node.get("status") or {}).get("pulls") or ():
            fig = out.setdefault(label(registry_of(pull)), RegistryFigures())
            fig.in_flight += 1
            rate = pull.get("bytesPerSecond")
            if isinstance(rate, (int, float)) and not isinstance(rate, bool):
                fig.bytes_per_second += float(rate)
            fig.nodes.add(name)
    for pod in pods:
        waiting = {str(i.get("image") or "") for i in (pod.get("status") or {}).get("images")
                   or () if i.get("waitingForSlot")}
        for image in waiting:
            out.setdefault(label(host_of_image(image)), RegistryFigures()).waiting += 1
    return out


class FleetMetrics:
    """Sets Metrics' fleet gauges before each scrape (``refresh``)."""

    def __init__(self, metrics: Metrics, feeds: Feeds, election: Election, *,
                 enabled: bool) -> None:
        self.metrics, self.feeds, self.election = metrics, feeds, election
        self.enabled = enabled
        self._label = RegistryLabels()
        self._shown: set[str] = set()
        self._held: Shared[str, NodeFeed] | None = None
        self._hold_timer: asyncio.TimerHandle | None = None

    async def refresh(self) -> None:
        if not self.enabled:
            return
        nodes = self.feeds.nodes
        if not self.election.is_leader or nodes is None:
            self._let_go()
            self._clear()
            return
        if self._held is not nodes:  # a new term made new feeds
            self._let_go()
            nodes.acquire("")
            self._held = nodes
        if self._hold_timer is not None:
            self._hold_timer.cancel()
        self._hold_timer = asyncio.get_running_loop().call_later(HOLD, self._let_go)
        feed = nodes.get("")
        if feed is None:
            return
        try:
            await asyncio.wait_for(feed.ready(), READY_WAIT)
        except (TimeoutError, StatusError):
            return  # still starting: the values of the last scrape stand
        self._show(fleet_view(feed.collection.objects.values(), feed.pod_objects(),
                              self._label))

    def _show(self, view: Mapping[str, RegistryFigures]) -> None:
        m = self.metrics
        # A registry's gauges fall to 0 once it has nothing (then stay, unchanged).
        for reg in self._shown | view.keys():
            fig = view.get(reg) or RegistryFigures()
            m.fleet_pulls_in_flight.labels(reg).set(fig.in_flight)
            m.fleet_pull_rate.labels(reg).set(fig.bytes_per_second)
            m.fleet_nodes_pulling.labels(reg).set(len(fig.nodes))
            m.fleet_pulls_waiting.labels(reg).set(fig.waiting)
        self._shown |= set(view)

    def _clear(self) -> None:
        m = self.metrics
        for g in (m.fleet_pulls_in_flight, m.fleet_pull_rate, m.fleet_nodes_pulling,
                  m.fleet_pulls_waiting):
            g.clear()
        self._shown = set()

    def _let_go(self) -> None:
        if self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None
        if self._held is not None:
            with contextlib.suppress(RuntimeError):
                self._held.release("")
            self._held = None

    def close(self) -> None:
        self._let_go()
