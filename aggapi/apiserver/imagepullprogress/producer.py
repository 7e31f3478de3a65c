"""The producer of one shared progress stream: waits for scheduling, relays the
agent's stream, merges Kubernetes' view in, and reads the node's pull slots while
a pull looks queued."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import aiohttp

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.imagepullprogress.fanout import Broadcast
from aggapi.apiserver.imagepullprogress.merge import Merger
from aggapi.apiserver.imagepullprogress.nodeview import fetch_node_view
from aggapi.apiserver.imagepullprogress.objects import is_terminal, now, object_key
from aggapi.apiserver.imagepullprogress.podwatch import PodWatch
from aggapi.apiserver.pods import PodTarget, target_from_pod
from aggapi.capability import ContainerRef
from aggapi.status import StatusError
from aggapi.wire import AGENT_PROGRESS_PATH, OP_PROGRESS

NODE_VIEW_INTERVAL = 2.0  # seconds between node-view fetches while a pull looks queued


class Producer:
    """One shared stream: waits for scheduling, relays the agent, merges Kubernetes.

    Runs until it publishes a final object (Summary or Error) or its last reader
    leaves (then it is cancelled, which closes the agent stream)."""

    def __init__(self, out: Broadcast, agent: AgentClient, pw: PodWatch, target: PodTarget,
                 containers: Sequence[ContainerRef], granularity: str, follow: bool,
                 user: str) -> None:
        self.out, self.agent, self.pw = out, agent, pw
        self.target, self.containers = target, containers
        self.granularity, self.follow, self.user = granularity, follow, user
        self.merger = Merger(containers)
        self.loop = asyncio.get_running_loop()
        self._node_view_at = 0.0
        # The agent's latest Progress objects and what we published for them: kubelet's
        # view (a Pulling event) or the node's slots can change while the agent has
        # nothing new to say, and the merged object must follow.
        self._raw: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._sent: dict[tuple[str, str, str, str], dict[str, Any]] = {}

    def _error(self, message: str, **extra: Any) -> None:
        self.out.publish({"kind": "Error", "phase": "Unknown", "time": now(),
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
                            "time": now()})
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
                "GET", AGENT_PROGRESS_PATH, node=node, subject=self.user,
                operation=OP_PROGRESS, pod_namespace=self.target.namespace,
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
        return is_terminal(obj)

    def _publish_merged(self, obj: dict[str, Any]) -> None:
        merged = self.merger.apply(obj)
        if obj.get("kind") == "Progress":
            key = object_key(obj)
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
                self.out.publish({**merged, "time": now()})

    async def _refresh_node_view(self, node: str) -> None:
        now = self.loop.time()
        if now - self._node_view_at < NODE_VIEW_INTERVAL:
            return
        self._node_view_at = now
        try:
            self.merger.node_view = await fetch_node_view(self.agent, node, self.user)
        except StatusError:
            self.merger.node_view = None
