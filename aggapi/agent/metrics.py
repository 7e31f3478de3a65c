"""Prometheus metrics of the agent, in a registry of its own (one per app)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from aggapi.status import StatusError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("aggapi_agent_requests", "Agent requests by route and code",
                                ["route", "code"], registry=self.registry)
        self.subscribers = Gauge("aggapi_agent_progress_subscribers",
                                 "Open image-pull-progress streams", registry=self.registry)
        self.polls = Gauge("aggapi_agent_progress_polls",
                           "Progress polls since start", registry=self.registry)
        self.poll_seconds = Gauge("aggapi_agent_progress_poll_seconds",
                                  "Duration of the last progress poll", registry=self.registry)
        self.runtime_calls = Gauge("aggapi_agent_containerd_calls",
                                   "containerd RPCs made since start", registry=self.registry)

    def bind(self, *, subscribers: Callable[[], float], polls: Callable[[], float],
             poll_seconds: Callable[[], float], runtime_calls: Callable[[], float]) -> None:
        self.subscribers.set_function(subscribers)
        self.polls.set_function(polls)
        self.poll_seconds.set_function(poll_seconds)
        self.runtime_calls.set_function(runtime_calls)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Inside status_middleware's view: counts what handlers and auth answered."""
        route = request.match_info.route.resource
        name = route.canonical if route is not None else "unmatched"
        try:
            resp = await handler(request)
        except StatusError as err:
            self.requests.labels(name, str(err.code)).inc()
            raise
        self.requests.labels(name, str(resp.status)).inc()
        return resp

    async def handler(self, _request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.registry))
        resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
        return resp
