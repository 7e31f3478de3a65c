"""Prometheus metrics of the agent, in a registry of its own (one per app).

docs/kep-aggapi.md's metrics table lists these names, types and labels: change both
together. The process and Python collectors are registered here too, so the one
registry is all a scrape needs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from aggapi import wire
from aggapi.status import StatusError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_NS = "aggapi_agent"
_COPY_METHODS = {"GET": "download", "POST": "upload"}  # HEAD (stat) moves no bytes
_COPY_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
# Image pulls: seconds from a few to an hour, sizes from 1 MiB to 16 GiB.
_PULL_BUCKETS = (1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)
_PULL_SIZE_BUCKETS = tuple(float(1 << s) for s in range(20, 35, 2))
_POLL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


def add_runtime_collectors(registry: CollectorRegistry) -> None:
    """process_* (CPU, memory, fds) and python_* (version, gc): both binaries use it."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class _CallCounter(Collector):
    """A counter whose value another object keeps (the containerd client's RPC count)."""

    def __init__(self, name: str, doc: str, value: Callable[[], float]) -> None:
        self.name, self.doc, self.value = name, doc, value

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self.name, self.doc, value=self.value())


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        add_runtime_collectors(r)
        self.requests = Counter(f"{_NS}_requests", "Agent requests by route and code.",
                                ["route", "code"], registry=r)
        self.subscribers = Gauge(f"{_NS}_progress_subscribers",
                                 "Open image-pull-progress streams.", registry=r)
        self.polls = Counter(f"{_NS}_progress_polls", "Progress polls of the runtime.",
                             registry=r)
        self.poll_seconds = Histogram(f"{_NS}_progress_poll_duration_seconds",
                                      "Time one progress poll of the runtime took.",
                                      registry=r, buckets=_POLL_BUCKETS)
        self.copy_bytes = Counter(f"{_NS}_copy_bytes",
                                  "Body bytes of copies by direction and result.",
                                  ["direction", "result"], registry=r)
        self.copy_seconds = Histogram(f"{_NS}_copy_duration_seconds",
                                      "Time a copy took, by direction and result.",
                                      ["direction", "result"], registry=r,
                                      buckets=_COPY_BUCKETS)
        # The node's image pulls (aggapi.agent.pullmetrics), by registry host.
        self.pulls_in_flight = Gauge(f"{_NS}_image_pulls_in_flight",
                                     "Image pulls in flight on the node, by registry host.",
                                     ["registry"], registry=r)
        self.pulls_stalled = Gauge(
            f"{_NS}_image_pulls_stalled",
            "Image pulls in flight whose bytes have not moved for --pull-stall-seconds.",
            ["registry"], registry=r)
        self.pull_bytes = Counter(f"{_NS}_image_pull_bytes",
                                  "Layer bytes the node's pulls received, by registry host.",
                                  ["registry"], registry=r)
        self.pull_link_rate = Gauge(
            f"{_NS}_image_pull_bytes_per_second",
            "Current download rate of the node's pulls, by registry host.",
            ["registry"], registry=r)
        self.pull_slots = Gauge(
            f"{_NS}_image_pull_slots",
            "Pulls kubelet runs at once on the node (+Inf: unlimited; NaN: not known).",
            registry=r)
        self.pull_seconds = Histogram(f"{_NS}_image_pull_duration_seconds",
                                      "Time an image pull took, by registry host.",
                                      ["registry"], registry=r, buckets=_PULL_BUCKETS)
        self.pull_size = Histogram(f"{_NS}_image_pull_size_bytes",
                                   "Bytes an image pull had to download, by registry host.",
                                   ["registry"], registry=r, buckets=_PULL_SIZE_BUCKETS)
        # The metrics port's delegated authentication and authorization (aggapi.auth.delegated).
        self.tokenreview = Counter(f"{_NS}_tokenreviews", "TokenReviews sent, by result.",
                                   ["result"], registry=r)
        self.token_cache = Counter(f"{_NS}_token_cache",
                                   "Token authentication cache lookups.", ["result"],
                                   registry=r)
        self.sar = Counter(f"{_NS}_subjectaccessreviews",
                           "SubjectAccessReviews sent, by result.", ["result"], registry=r)
        self.sar_cache = Counter(f"{_NS}_authorization_cache",
                                 "Authorization cache lookups.", ["result"], registry=r)
        # Set in bind(): the bytes a download handed over, and whether that is all of it.
        self._sent: Callable[[web.Request], tuple[int, bool]] = lambda _r: (0, False)

    def bind(self, *, subscribers: Callable[[], float], runtime_calls: Callable[[], float],
             sent: Callable[[web.Request], tuple[int, bool]]) -> None:
        """``sent``: the body bytes a download handed over for a request, and whether
        that was its whole body."""
        self.subscribers.set_function(subscribers)
        self.registry.register(_CallCounter(
            f"{_NS}_containerd_calls", "containerd RPCs made.", runtime_calls))
        self._sent = sent

    def observe_poll(self, seconds: float) -> None:
        self.polls.inc()
        self.poll_seconds.observe(seconds)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 if absent): for tests and benchmarks."""
        return self.registry.get_sample_value(name, labels) or 0.0

    def _copied(self, request: web.Request, direction: str, result: str,
                started: float) -> None:
        if direction == "upload":
            moved = request.content.total_bytes
        else:
            moved, whole = self._sent(request)
            if result == "aborted" and whole:
                result = "success"  # the client had every byte before it hung up
        self.copy_bytes.labels(direction, result).inc(moved)
        self.copy_seconds.labels(direction, result).observe(time.monotonic() - started)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Inside status_middleware's view: counts what handlers and auth answered;
        for copies also the bytes moved and the time taken. ``result`` is success
        (2xx), error (an error status) or aborted (the connection was cut)."""
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        direction = _COPY_METHODS.get(request.method) if name == wire.AGENT_COPY_PATH else None
        started = time.monotonic()
        result = "error"
        try:
            resp = await handler(request)
        except StatusError as err:
            self.requests.labels(name, str(err.code)).inc()
            raise
        except (asyncio.CancelledError, ConnectionResetError):
            result = "aborted"
            raise
        else:
            self.requests.labels(name, str(resp.status)).inc()
            result = "success" if resp.status < 400 else "error"
            return resp
        finally:
            if direction is not None:
                self._copied(request, direction, result, started)

    async def handler(self, _request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.registry))
        resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return resp
