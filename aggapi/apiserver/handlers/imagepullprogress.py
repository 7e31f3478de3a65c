"""pods/imagepullprogress and nodes/imagepulls (KEP-5334).

The agent reports what the runtime shows (bytes per layer); Kubernetes reports
what kubelet decided (scheduled yet, pull started, pull failed with the registry's
text, back-off). This handler merges the two into one stream:

- unscheduled pod: ``Unscheduled`` objects until it has a node;
- kubelet failed or backs off: the object carries the error, then a final
  ``kind: Error`` ends the stream (so ``kubectl get --raw`` exits);
- kubelet said ``Pulling`` but the runtime shows nothing while the node is at its
  pull limit (KEP-3673): ``Waiting`` with the node's in-flight pulls and the limit;
- every image present: the agent's ``kind: Summary`` ends the stream.

On the plain path (verb get) kube-apiserver cuts the request at 60 s, possibly
mid-line, so the stream ends itself before ``--stream-deadline`` with a
``kind: Timeout`` object naming the long-running ``/watch/`` path to resume on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from aiohttp import web

from aggapi import GROUP, VERSION, imageref
from aggapi.apiserver import appkeys
from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.fanout import Broadcast, SharedStreams
from aggapi.apiserver.handlers import agent_client
from aggapi.apiserver.pods import PodTarget, pods_on_node, target_from_pod
from aggapi.apiserver.podwatch import PodWatch
from aggapi.apiserver.pullstate import K8sView, views
from aggapi.apiserver.shutdown import track_stream
from aggapi.apiserver.streaming import ObjectStream
from aggapi.capability import ContainerRef
from aggapi.status import StatusError, not_found

GRANULARITIES = ("layer", "image", "pod")
# Readers wake at most this often: one agent poll's objects go out in one write.
FANOUT_LINGER = 0.03
NODE_VIEW_INTERVAL = 2.0  # seconds between node-view fetches while a pull looks queued
SYNC_TIMEOUT = 10.0
# Agent phases that mean "the runtime shows no activity for this image yet".
IDLE_PHASES = ("Unknown", "Waiting", "Resolving")
K8S_FAILURES = ("Failed", "BackOff")


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


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _watch_path(namespace: str, name: str, query: Mapping[str, str]) -> str:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    path = f"/apis/{GROUP}/{VERSION}/watch/namespaces/{namespace}/pods/{name}/imagepullprogress"
    return f"{path}?{qs}" if qs else path


class _Merger:
    """Applies Kubernetes' view to the agent's objects for one stream."""

    def __init__(self, containers: Sequence[ContainerRef]) -> None:
        self.containers = containers
        self.k8s: dict[str, K8sView] = {}
        self.node_view: dict[str, Any] | None = None

    def update(self, pod: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> None:
        self.k8s = views(pod, events, self.containers)

    def failure(self) -> dict[str, Any] | None:
        """The Error object that ends the stream if kubelet gave up on an image."""
        for c in self.containers:
            v = self.k8s.get(c.name)
            if v is not None and v.phase in K8S_FAILURES:
                return {"kind": "Error", "container": c.name, "image": c.image,
                        "phase": v.phase, "error": v.error or f"image pull {v.phase}",
                        "time": _now()}
        return None

    def queued(self, obj: Mapping[str, Any]) -> bool:
        """kubelet is pulling this image but the runtime shows nothing yet."""
        v = self.k8s.get(str(obj.get("container") or ""))
        return (v is not None and v.phase == "Pulling" and obj.get("phase") in IDLE_PHASES
                and int(obj.get("progress") or 0) <= 0)

    def waiting(self, image: str) -> dict[str, Any] | None:
        """The node's pull slots are all taken, by pulls other than this image's own."""
        nv = self.node_view
        if not nv:
            return None
        free = nv.get("slotsFree")
        if free is None or free > 0:
            return None
        try:
            ref = imageref.parse(image)
        except imageref.InvalidReference:
            return None
        for pull in nv.get("pulls") or []:
            if str(ref) in (pull.get("images") or []):
                return None  # the busy slot is this image's own pull, just starting
        return {"inFlight": nv.get("pulls") or [], "limit": (nv.get("kubelet") or {}),
                "inFlightCount": nv.get("inFlight")}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        if obj.get("kind") != "Progress":
            return obj
        name = str(obj.get("container") or "")
        v = self.k8s.get(name)
        if v is None:
            return obj
        if v.phase in K8S_FAILURES:
            return {**obj, "phase": v.phase, "error": v.error}
        if self.queued(obj):
            waiting = self.waiting(str(obj.get("image") or ""))
            if waiting is not None:
                return {**obj, "phase": "Waiting", "waiting": waiting}
        return obj


async def pod_progress(request: web.Request) -> web.StreamResponse:
    info = request[appkeys.INFO]
    granularity = request.query.get("granularity", "layer")
    if granularity not in GRANULARITIES:
        raise StatusError(400, f"granularity must be one of {', '.join(GRANULARITIES)}")
    follow = _bool(request, "follow", True)
    wanted = request.query.getall("container", [])
    agent = agent_client(request)
    hub = request.app[appkeys.POD_WATCHES]

    # The client holds the pod watch too, so the shared producer finds it warm.
    async with hub.watch(info.namespace, info.name) as pw:
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
        return await _follow(request, agent, target, containers, granularity, follow)


async def _follow(request: web.Request, agent: AgentClient, target: PodTarget,
                  containers: Sequence[ContainerRef], granularity: str,
                  follow: bool) -> web.StreamResponse:
    info = request[appkeys.INFO]
    hub = request.app[appkeys.POD_WATCHES]
    loop = asyncio.get_running_loop()
    deadline = None if info.verb == "watch" else (
        loop.time() + request.app[appkeys.CONFIG].stream_deadline)
    resume = _watch_path(info.namespace, info.name,
                         {k: v for k, v in request.query.items() if k != "timeout"})
    user = request[appkeys.USER].name
    # Clients asking the same thing share one producer (agent stream + merge). The user
    # is part of the key so the agent's audit trail names who asked.
    key = (user, target.namespace, target.name, target.uid,
           tuple(c.name for c in containers), granularity, follow)

    async def produce(out: Broadcast) -> None:
        async with hub.watch(target.namespace, target.name) as watch:
            await _Producer(out, agent, watch, target, containers, granularity, follow,
                            user).run()

    stream = ObjectStream(request)
    await stream.start()
    async with track_stream(request) as shutdown, \
            request.app[appkeys.PROGRESS_STREAMS].join(key, produce) as bc:
        since = -1
        while not bc.drained(since):
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                await stream.send(_timeout("request deadline reached; resume on the /watch/ "
                                           "path, which kube-apiserver does not cut", resume))
                break
            if shutdown.is_set():
                await stream.send(_timeout("server shutting down; resume on the /watch/ path",
                                           resume))
                break
            items = await bc.read(since, 1.0 if remaining is None else min(1.0, remaining))
            if not items:
                continue
            await stream.send_items(items)
            since = items[-1].seq
            if items[-1].terminal:
                break
    return await stream.finish()


def _timeout(why: str, resume: str) -> dict[str, Any]:
    return {"kind": "Timeout", "message": why, "resume": resume, "time": _now()}


def _object_key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    return (str(obj.get("kind")), str(obj.get("container") or ""),
            str(obj.get("image") or ""), str(obj.get("layer") or ""))


def _is_terminal(obj: Mapping[str, Any]) -> bool:
    return obj.get("kind") in ("Summary", "Error")


def _crashed(exc: BaseException) -> dict[str, Any]:
    return {"kind": "Error", "phase": "Unknown", "time": _now(),
            "error": f"internal error following the pull: {type(exc).__name__}"}


def new_progress_streams() -> SharedStreams:
    return SharedStreams(key_of=_object_key, is_terminal=_is_terminal, on_crash=_crashed,
                         linger=FANOUT_LINGER)


class _Producer:
    """One shared stream: waits for scheduling, relays the agent, merges Kubernetes.

    Runs until it publishes a final object (Summary or Error) or its last reader
    leaves (then it is cancelled, which closes the agent stream)."""

    def __init__(self, out: Broadcast, agent: AgentClient, pw: PodWatch, target: PodTarget,
                 containers: Sequence[ContainerRef], granularity: str, follow: bool,
                 user: str) -> None:
        self.out, self.agent, self.pw = out, agent, pw
        self.target, self.containers = target, containers
        self.granularity, self.follow, self.user = granularity, follow, user
        self.merger = _Merger(containers)
        self.loop = asyncio.get_running_loop()
        self._node_view_at = 0.0
        # The agent's latest Progress objects and what we published for them: kubelet's
        # view (a Pulling event) or the node's slots can change while the agent has
        # nothing new to say, and the merged object must follow.
        self._raw: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._sent: dict[tuple[str, str, str, str], dict[str, Any]] = {}

    def _error(self, message: str, **extra: Any) -> None:
        self.out.publish({"kind": "Error", "phase": "Unknown", "time": _now(),
                          "error": message, **extra})

    async def run(self) -> None:
        version = -1
        while True:
            pod = self.pw.pod
            if pod is None or (pod.get("metadata") or {}).get("uid") != self.target.uid:
                self._error("the pod was deleted or replaced")
                return
            self.merger.update(pod, self.pw.events)
            if not (pod.get("spec") or {}).get("nodeName"):
                if self.pw.version != version:
                    for c in self.containers:
                        self.out.publish({
                            "kind": "Progress", "container": c.name, "image": c.image,
                            "layer": "", "phase": "Unscheduled", "progress": -1, "total": -1,
                            "error": "", "bytesPerSecond": None, "etaSeconds": None,
                            "time": _now()})
                if not self.follow:
                    return
                version = self.pw.version
                await self.pw.wait_changed(version, 3600)
                continue
            self.target = target_from_pod(pod)
            await self._relay_agent()
            return

    async def _relay_agent(self) -> None:
        failure = self.merger.failure()
        if failure is not None:
            self.out.publish(failure)
            return
        node = self.target.node
        try:
            upstream = await self.agent.open(
                "GET", "/v1/imagepullprogress", node=node, subject=self.user,
                operation="imagepullprogress", pod_namespace=self.target.namespace,
                pod_name=self.target.name, pod_uid=self.target.uid,
                containers=self.containers, params={"granularity": self.granularity},
                query={"granularity": self.granularity,
                       "follow": "true" if self.follow else "false"})
        except StatusError as err:
            self._error(err.message, code=err.code)
            return
        try:
            await self._pump(upstream, node)
        finally:
            upstream.close()

    async def _pump(self, upstream: aiohttp.ClientResponse, node: str) -> None:
        line_task: asyncio.Task[bytes] | None = None
        pod_version = self.pw.version
        pod_task: asyncio.Task[int] | None = None
        try:
            while True:
                if line_task is None:
                    line_task = asyncio.ensure_future(upstream.content.readline())
                if pod_task is None:
                    pod_task = asyncio.ensure_future(self.pw.wait_changed(pod_version, 3600))
                # While a pull looks queued, wake up to re-read the node's slots: the
                # agent has nothing new to say until that pull starts.
                done, _ = await asyncio.wait(
                    {line_task, pod_task}, return_when=asyncio.FIRST_COMPLETED,
                    timeout=NODE_VIEW_INTERVAL if self._any_queued() else None)
                if not done:
                    await self._remerge(node)
                    continue
                if pod_task in done:
                    pod_version = pod_task.result()
                    pod_task = None
                    pod = self.pw.pod
                    if pod is None:
                        self._error("the pod was deleted")
                        return
                    self.merger.update(pod, self.pw.events)
                    failure = self.merger.failure()
                    if failure is not None:
                        self.out.publish(failure)
                        return
                    await self._remerge(node)
                if line_task in done:
                    try:
                        line = line_task.result()
                    except (aiohttp.ClientError, ConnectionError) as exc:
                        line, lost = b"", str(exc) or type(exc).__name__
                    else:
                        lost = "connection closed"
                    line_task = None
                    if not line:
                        if self.follow:
                            self._error(f'lost the stream from the aggapi agent on node '
                                        f'"{node}" ({lost}); retry the request')
                        return
                    if await self._forward(line, node):
                        return
        finally:
            for t in (line_task, pod_task):
                if t is not None:
                    t.cancel()
                    with contextlib.suppress(BaseException):
                        await t

    async def _forward(self, line: bytes, node: str) -> bool:
        """Publish one agent object, merged; True when it ended the stream."""
        try:
            obj = json.loads(line)
        except ValueError:
            return False
        if not isinstance(obj, dict):
            return False
        if self.merger.queued(obj):
            await self._refresh_node_view(node)
        self._publish_merged(obj)
        if obj.get("kind") == "Progress":
            failure = self.merger.failure()
            if failure is not None:
                self.out.publish(failure)
                return True
        return _is_terminal(obj)

    def _publish_merged(self, obj: dict[str, Any]) -> None:
        merged = self.merger.apply(obj)
        if obj.get("kind") == "Progress":
            key = _object_key(obj)
            self._raw[key] = obj
            self._sent[key] = merged
        self.out.publish(merged)

    def _any_queued(self) -> bool:
        return any(self.merger.queued(o) for o in self._raw.values())

    async def _remerge(self, node: str) -> None:
        """Publish again the objects whose merged form changed without agent news."""
        if self._any_queued():
            await self._refresh_node_view(node)
        for key, obj in list(self._raw.items()):
            merged = self.merger.apply(obj)
            if merged != self._sent.get(key):
                self._sent[key] = merged
                self.out.publish({**merged, "time": _now()})

    async def _refresh_node_view(self, node: str) -> None:
        now = self.loop.time()
        if now - self._node_view_at < NODE_VIEW_INTERVAL:
            return
        self._node_view_at = now
        try:
            self.merger.node_view = await fetch_node_view(self.agent, node, self.user)
        except StatusError:
            self.merger.node_view = None


async def fetch_node_view(agent: AgentClient, node: str, subject: str) -> dict[str, Any]:
    resp = await agent.open("GET", "/v1/imagepulls", node=node, subject=subject,
                            operation="imagepulls")
    try:
        data: dict[str, Any] = await resp.json(content_type=None)
        return data
    finally:
        resp.release()


async def node_pulls(request: web.Request) -> web.StreamResponse:
    """Every in-flight pull on a node, with the pods on that node waiting for it."""
    node = request.match_info["name"]
    agent = agent_client(request)
    view = await fetch_node_view(agent, node, request[appkeys.USER].name)
    pods = await _pods_on_node(request, node)
    for pull in view.get("pulls") or []:
        pull["pods"] = _waiting_pods(pull, pods)
    return web.json_response(view)


async def _pods_on_node(request: web.Request, node: str) -> list[PodTarget]:
    return await pods_on_node(request.app[appkeys.KUBE_API], node)


def _waiting_pods(pull: Mapping[str, Any], pods: Sequence[PodTarget]) -> list[dict[str, str]]:
    """Pods whose images this pull brings: the same image, or the same repository
    (containerd's distribution-source labels name host-without-port/repository)."""
    images = set(pull.get("images") or [])
    repos = set(pull.get("repositories") or [])
    out = []
    for p in pods:
        for c in p.containers:
            try:
                ref = imageref.parse(c.image)
            except imageref.InvalidReference:
                continue
            if str(ref) in images or f"{ref.host}/{ref.path}" in repos:
                out.append({"namespace": p.namespace, "name": p.name, "container": c.name,
                            "image": c.image})
    return out
