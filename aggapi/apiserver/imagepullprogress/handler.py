"""The HTTP side of pods/imagepullprogress: parameters in, the shared stream out.

On the plain path (verb get) kube-apiserver cuts the request at 60 s, possibly
mid-line, so the stream ends itself before ``--stream-deadline`` with a
``kind: Timeout`` object naming the long-running ``/watch/`` path to resume on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from aiohttp import web

from aggapi import GROUP, VERSION
from aggapi.apiserver.agentclient import AgentClient, require_agent
from aggapi.apiserver.authz import PERMITS, Also
from aggapi.apiserver.imagepullprogress.fanout import Broadcast, SharedStreams
from aggapi.apiserver.imagepullprogress.objects import timeout
from aggapi.apiserver.imagepullprogress.podwatch import PodWatchHub
from aggapi.apiserver.imagepullprogress.producer import Producer
from aggapi.apiserver.imagepullprogress.streaming import ObjectStream
from aggapi.apiserver.pods import PodTarget, target_from_pod
from aggapi.apiserver.requestinfo import INFO
from aggapi.apiserver.shutdown import Lifecycle
from aggapi.apiserver.user import USER
from aggapi.auth.capability import ContainerRef
from aggapi.status import StatusError, not_found
from aggapi.wire import GROUP_VERSION_PATH

GRANULARITIES = ("layer", "image", "pod")
# Declared optional on the route (routes.py): who may see every pull on the node
# sees other pods' (other namespaces') pulls while Waiting, not just their count.
SEE_NODE_PULLS = Also(verb="get", group=GROUP, version=VERSION, resource="nodes",
                      subresource="imagepulls", methods=frozenset({"GET", "HEAD"}),
                      cluster=True)
SYNC_TIMEOUT = 10.0


def _bool(request: web.Request, name: str, default: bool) -> bool:
    raw = request.query.get(name)
    if raw in (None, ""):
        return default
    assert raw is not None
    if raw.lower() in ("true", "1"):
        return True
    if raw.lower() in ("false", "0"):
        return False
    raise StatusError(400, f"query parameter {name!r} must be true or false, got {raw!r}")


def _watch_path(namespace: str, name: str, query: Mapping[str, str]) -> str:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    path = f"{GROUP_VERSION_PATH}/watch/namespaces/{namespace}/pods/{name}/imagepullprogress"
    return f"{path}?{qs}" if qs else path


class PodProgressHandler:
    """Streams one pod's pull progress; clients asking the same thing share a producer."""

    def __init__(self, agent: AgentClient | None, pod_watches: PodWatchHub,
                 streams: SharedStreams, lifecycle: Lifecycle, *,
                 stream_deadline: float) -> None:
        self.agent = agent
        self.pod_watches = pod_watches
        self.streams = streams
        self.lifecycle = lifecycle
        self.stream_deadline = stream_deadline

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        info = request[INFO]
        granularity = request.query.get("granularity", "layer")
        if granularity not in GRANULARITIES:
            raise StatusError(400, f"granularity must be one of {', '.join(GRANULARITIES)}")
        follow = _bool(request, "follow", True)
        wanted = request.query.getall("container", [])
        agent = require_agent(self.agent)

        # The client holds the pod watch too, so the shared producer finds it warm.
        async with self.pod_watches.watch(info.namespace, info.name) as pw:
            try:
                await pw.synced(SYNC_TIMEOUT)
            except TimeoutError:
                raise StatusError(503, "timed out reading the pod from the Kubernetes API",
                                  retry_after=2) from None
            if pw.pod is None:
                raise not_found("pods", info.name)
            target = target_from_pod(pw.pod)
            containers = target.select(wanted)
            if target.node:
                await agent.directory.endpoint(target.node)  # no agent: 503 before streaming
            return await self._follow(request, agent, target, containers, granularity,
                                      follow)

    async def _follow(self, request: web.Request, agent: AgentClient, target: PodTarget,
                      containers: Sequence[ContainerRef], granularity: str,
                      follow: bool) -> web.StreamResponse:
        info = request[INFO]
        loop = asyncio.get_running_loop()
        deadline = None if info.verb == "watch" else loop.time() + self.stream_deadline
        resume = _watch_path(info.namespace, info.name,
                             {k: v for k, v in request.query.items() if k != "timeout"})
        user = request[USER].name
        permits = request.get(PERMITS)

        async def see_node_pulls() -> bool:
            return permits is not None and await permits.allows(SEE_NODE_PULLS)
        # Clients asking the same thing share one producer (agent stream + merge). The
        # user is part of the key so the agent's audit trail names who asked.
        key = (user, target.namespace, target.name, target.uid,
               tuple(c.name for c in containers), granularity, follow)
        hub = self.pod_watches

        async def produce(out: Broadcast) -> None:
            async with hub.watch(target.namespace, target.name) as watch:
                await Producer(out, agent, watch, target, containers, granularity, follow,
                               user, may_see_node_pulls=see_node_pulls).run()

        stream = ObjectStream(request)
        await stream.start()
        async with self.lifecycle.track(info.subresource) as shutdown, \
                self.streams.join(key, produce) as bc:
            since = -1
            while not bc.drained(since):
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    await stream.send(timeout("request deadline reached; resume on the "
                                              "/watch/ path, which kube-apiserver does not "
                                              "cut", resume))
                    break
                # Progress is resumable (a new request gets the current state): end at the
                # start of draining, not after the grace copies get, so the client
                # reconnects to another replica within seconds.
                if shutdown.is_set() or self.lifecycle.draining.is_set():
                    await stream.send(timeout("server shutting down; resume on the /watch/ "
                                              "path", resume))
                    break
                items = await bc.read(since, 1.0 if remaining is None else min(1.0, remaining))
                if not items:
                    continue
                await stream.send_items(items)
                since = items[-1].seq
                if items[-1].terminal:
                    break
        return await stream.finish()
