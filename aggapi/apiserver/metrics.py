"""Prometheus metrics of one apiserver app (own registry, so tests can build many apps)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
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

from aggapi.apiserver.requestinfo import INFO
from aggapi.status import Handler

_NS = "aggapi_apiserver"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # process_* and python_*: CPU, memory, fds, gc, as every Go component exports.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        self.requests = Counter(f"{_NS}_requests", "Requests by subresource, verb and code.",
                                ["subresource", "verb", "code"], registry=r)
        self.latency = Histogram(
            f"{_NS}_request_duration_seconds", "Time to the end of the response.",
            ["subresource", "verb"], registry=r,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.streams = Gauge(f"{_NS}_streams_in_flight", "Open streaming responses.",
                             ["subresource"], registry=r)
        self.sar = Counter(f"{_NS}_subjectaccessreviews", "SubjectAccessReviews sent, by result.",
                           ["result"], registry=r)
        self.sar_cache = Counter(f"{_NS}_authorization_cache", "Authorization cache lookups.",
                                 ["result"], registry=r)
        self.tokenreview = Counter(f"{_NS}_tokenreviews", "TokenReviews sent, by result.",
                                   ["result"], registry=r)
        self.token_cache = Counter(f"{_NS}_token_cache", "Token authentication cache lookups.",
                                   ["result"], registry=r)
        # The collections' cost (issue 25's goal: a few watches whatever the pod count).
        self.collection_watches = Gauge(
            f"{_NS}_collection_watches",
            "Watches the collections hold on kube-apiserver.", registry=r)
        self.collection_node_polls = Gauge(
            f"{_NS}_collection_node_polls",
            "Nodes whose agent the collections poll.", registry=r)
        # The fleet's pulls per registry host, from the collections (--fleet-metrics; the
        # leader only: collections.fleet).
        self.fleet_pulls_in_flight = Gauge(
            f"{_NS}_fleet_image_pulls_in_flight",
            "Image pulls in flight on all nodes, by registry host.", ["registry"], registry=r)
        self.fleet_pull_rate = Gauge(
            f"{_NS}_fleet_image_pull_bytes_per_second",
            "Download rate of all nodes' pulls, by registry host.", ["registry"], registry=r)
        self.fleet_nodes_pulling = Gauge(
            f"{_NS}_fleet_nodes_pulling",
            "Nodes with an image pull in flight, by registry host.", ["registry"], registry=r)
        self.fleet_pulls_waiting = Gauge(
            f"{_NS}_fleet_image_pulls_waiting",
            "Pods' images waiting for a kubelet pull slot, by registry host.", ["registry"],
            registry=r)
        self.authn_failures = Counter(f"{_NS}_authentication_failures",
                                      "Rejected authentications by reason.", ["reason"],
                                      registry=r)

    def value(self, name: str, **labels: str) -> float:
        """A sample's current value (0 if absent): for tests and benchmarks."""
        v = self.registry.get_sample_value(name, labels)
        return v or 0.0


def _label(request: web.Request) -> tuple[str, str]:
    info = request.get(INFO)
    if info is None or not info.is_resource_request:
        return "", request.method.lower()
    return info.subresource or info.resource, info.verb


def metrics_middleware(metrics: Metrics) -> Middleware:
    """Counts every request and its latency by subresource, verb and final code."""

    @web.middleware
    async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.monotonic()
        code = 500
        try:
            resp = await handler(request)
            code = resp.status
            return resp
        except web.HTTPException as exc:
            code = exc.status
            raise
        finally:
            sub, verb = _label(request)
            metrics.requests.labels(sub, verb, str(code)).inc()
            metrics.latency.labels(sub, verb).observe(time.monotonic() - start)

    return measure


def metrics_handler(metrics: Metrics,
                    refresh: Callable[[], Awaitable[None]] | None = None) -> Handler:
    """GET /metrics: this app's registry in Prometheus' text format (``refresh`` sets
    the gauges read at scrape time first)."""

    async def serve(_request: web.Request) -> web.StreamResponse:
        if refresh is not None:
            await refresh()
        return web.Response(body=generate_latest(metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    return serve
