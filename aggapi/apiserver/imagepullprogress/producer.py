"""The producer of one shared progress stream: waits for scheduling, relays the
agent's stream, merges Kubernetes' view in, and reads the node's pull slots while
a pull looks queued.

Every stream it produces ends with exactly one final object: the agent's Summary,
an Error, or (a ``follow=false`` snapshot, an unscheduled pod's too) a Summary of
its own with ``complete: false``; a followed unscheduled pod is waited for. While
following, a failed pull does not end the stream: kubelet retries after its
back-off, and the producer reopens the agent's stream for each new attempt; only a
failure kubelet never retries ends it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.imagepullprogress import layerset
from aggapi.apiserver.imagepullprogress.fanout import Broadcast
from aggapi.apiserver.imagepullprogress.merge import K8S_FAILURES, Merger
from aggapi.apiserver.imagepullprogress.nodeview import fetch_node_view
from aggapi.apiserver.imagepullprogress.objects import (
    PRESENT,
    is_terminal,
    now,
    object_key,
    snapshot_summary,
)
from aggapi.apiserver.imagepullprogress.podwatch import PodWatch
from aggapi.apiserver.pods import PodTarget, target_from_pod
from aggapi.auth.capability import ContainerRef
from aggapi.status import StatusError
from aggapi.wire import AGENT_PROGRESS_PATH, OP_PROGRESS, PARAM_PULLS_BEGAN, encode_pulls_began

NODE_VIEW_INTERVAL = 2.0  # seconds between node-view fetches while a pull looks queued
# After the agent said a pull failed: how soon to look again while kubelet retries
# (the agent shows the failure until the new attempt's lease appears), and at the
# latest without any news from kubelet.
RETRY_DELAY = 1.0
RETRY_POLL = 30.0


class Producer:
    """One shared stream: waits for scheduling, relays the agent, merges Kubernetes.

    Runs until it publishes a final object (Summary or Error) or its last reader
    leaves (then it is cancelled, which closes the agent stream)."""

    def __init__(self, out: Broadcast, agent: AgentClient, pw: PodWatch, target: PodTarget,
                 containers: Sequence[ContainerRef], granularity: str, follow: bool,
                 user: str, *,
                 may_see_node_pulls: Callable[[], Awaitable[bool]] | None = None) -> None:
        self.out, self.agent, self.pw = out, agent, pw
        self.target, self.containers = target, containers
        self.granularity, self.follow, self.user = granularity, follow, user
        self.merger = Merger(containers)
        self._may_see_node_pulls = may_see_node_pulls
        self.loop = asyncio.get_running_loop()
        self._node_view_at = 0.0
        self._k8s_version = -1  # the PodWatch version the merger last read
        self._ended = False
        self._agent_failure: dict[str, Any] | None = None  # a snapshot's, held to the end
        self._held = False  # the agent's Summary came while kubelet pulls again
        # The agent's latest Progress objects and what we published for them: kubelet's
        # view (a Pulling event) or the node's slots can change while the agent has
        # nothing new to say, and the merged object must follow.
        self._raw: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self._sent: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        # image-level objects standing for layers held back (layerset)
        self._placeholders: set[tuple[str, str, str, str]] = set()
        self._attempts: dict[tuple[str, str, str, str], int] = {}  # the latest, sent

    def _publish(self, obj: dict[str, Any]) -> None:
        if self._ended:
            return
        if obj.get("kind") == "Progress":
            obj = self._in_attempt(obj)
        self._ended = is_terminal(obj)
        self.out.publish(obj)

    def _in_attempt(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Each attempt starts with its own Pulling: kubelet's
        Pulling and Failed for a pull that fails at once often come together, and
        the stream then never sees that attempt pulling. Attempts never go back."""
        key, attempt = object_key(obj), obj.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            return obj
        seen = self._attempts.get(key)
        if seen is not None and attempt < seen:
            return {**obj, "attempt": seen}
        self._attempts[key] = attempt
        if seen is not None and attempt > seen and obj.get("phase") in K8S_FAILURES:
            start = {k: v for k, v in obj.items() if k != "backOffSeconds"}
            start.update(phase="Pulling", error="")
            self.out.publish(start)
        return obj

    def _error(self, message: str, **extra: Any) -> None:
        self._publish({"kind": "Error", "phase": "Unknown", "time": now(),
                       "error": message, **extra})

    async def run(self) -> None:
        await self._run()
        if not self._ended:  # a snapshot (follow=false) ends with its own Summary
            self._publish(snapshot_summary(self.containers, list(self._sent.values())))

    async def _run(self) -> None:
        version = -1
        while True:
            pod = self.pw.pod
            if pod is None or (pod.get("metadata") or {}).get("uid") != self.target.uid:
                self._error("the pod was deleted or replaced")
                return
            self._merge_k8s(pod)
            if not (pod.get("spec") or {}).get("nodeName"):
                if self.pw.version != version:
                    for c in self.containers:
                        self._publish_merged({
                            "kind": "Progress", "container": c.name, "image": c.image,
                            "layer": "", "phase": "Unscheduled", "progress": None,
                            "total": None, "error": "", "bytesPerSecond": None,
                            "etaSeconds": None, "time": now()}, merge=False)
                if not self.follow:
                    return
                version = self.pw.version
                await self.pw.wait_changed(version, 3600)
                continue
            self.target = target_from_pod(pod)
            for key in [k for k, o in self._raw.items() if o.get("phase") == "Unscheduled"]:
                del self._raw[key], self._sent[key]
            await self._relay_agent()
            return

    async def _relay_agent(self) -> None:
        node = self.target.node
        while True:
            # A snapshot shows a failure on its objects first, and ends with it below.
            failure = self.merger.failure(self.follow) if self.follow else None
            if failure is not None:
                self._publish(failure)
                return
            try:
                upstream = await self.agent.open(
                    "GET", AGENT_PROGRESS_PATH, node=node, subject=self.user,
                    operation=OP_PROGRESS, pod_namespace=self.target.namespace,
                    pod_name=self.target.name, pod_uid=self.target.uid,
                    containers=self.containers, params=self._agent_params(),
                    query={"granularity": self.granularity,
                           "follow": "true" if self.follow else "false"})
            except StatusError as err:
                self._error(err.message, code=err.code)
                return
            try:
                again = await self._pump(upstream, node)
            finally:
                upstream.close()
            if not again:
                if not self.follow:
                    failure = self.merger.failure(False) or self._agent_failure
                    if failure is not None:
                        self._publish(failure)
                return
            if self._held:
                # kubelet pulls an image the agent found present: ask again shortly,
                # until the agent follows that pull or kubelet says it is done.
                self._held = False
                await asyncio.sleep(RETRY_DELAY)
                if not self._pod_update():
                    return
                await self._remerge(node)
                continue
            if not await self._await_retry(node):
                return

    def _agent_params(self) -> dict[str, str]:
        """What the token vouches for: the granularity, and when each of the pod's
        finished pulls began (an agent that did not watch a pull cannot tell)."""
        params = {"granularity": self.granularity}
        began = self.merger.pulls_began()
        if began:
            params[PARAM_PULLS_BEGAN] = encode_pulls_began(began)
        return params

    async def _await_retry(self, node: str) -> bool:
        """The agent said the pull failed: follow kubelet's back-off until it pulls
        again. False when the stream ended meanwhile."""
        deadline = self.loop.time() + RETRY_POLL
        while not self.merger.retrying():
            left = deadline - self.loop.time()
            if left <= 0:
                return True
            await self.pw.wait_changed(self._k8s_version, left)
            if not self._pod_update():
                return False
            await self._remerge(node)
        await asyncio.sleep(RETRY_DELAY)
        return True

    def _merge_k8s(self, pod: dict[str, Any]) -> None:
        # The version read with the pod and its events (no await between): the pump
        # waits for changes after it, so one that lands while the agent's stream
        # opens is not skipped.
        self._k8s_version = self.pw.version
        self.merger.update(pod, self.pw.events)

    def _pod_update(self) -> bool:
        """Read the pod's latest state; False (and the final object) if it ends the stream."""
        pod = self.pw.pod
        if pod is None or (pod.get("metadata") or {}).get("uid") != self.target.uid:
            self._error("the pod was deleted or replaced")
            return False
        self._merge_k8s(pod)
        failure = self.merger.failure(self.follow)
        if failure is not None:
            self._publish(failure)
            return False
        return True

    async def _pump(self, upstream: aiohttp.ClientResponse, node: str) -> bool:
        """Relay the agent's stream; True when it ended on a failed pull that kubelet
        will retry (follow only), False when the stream is over."""
        line_task: asyncio.Task[bytes] | None = None
        pod_version = self._k8s_version
        pod_task: asyncio.Task[int] | None = None
        try:
            while True:
                if line_task is None:
                    line_task = asyncio.ensure_future(upstream.content.readline())
                if pod_task is None and self.follow:
                    pod_task = asyncio.ensure_future(self.pw.wait_changed(pod_version, 3600))
                # While a pull looks queued, wake up to re-read the node's slots: the
                # agent has nothing new to say until that pull starts.
                waits = {t for t in (line_task, pod_task) if t is not None}
                done, _ = await asyncio.wait(
                    waits, return_when=asyncio.FIRST_COMPLETED,
                    timeout=NODE_VIEW_INTERVAL if self._any_queued() else None)
                if not done:
                    await self._remerge(node)
                    continue
                if pod_task is not None and pod_task in done:
                    pod_version = pod_task.result()
                    pod_task = None
                    if not self._pod_update():
                        return False
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
                        return False
                    verdict = await self._forward(line, node)
                    if verdict is not None:
                        return verdict
        finally:
            for t in (line_task, pod_task):
                if t is not None:
                    t.cancel()
                    with contextlib.suppress(BaseException):
                        await t

    async def _forward(self, line: bytes, node: str) -> bool | None:
        """Publish one agent object, merged. None: go on; False: the stream ended;
        True: the agent ended on a failed pull kubelet retries (see _pump)."""
        try:
            obj = json.loads(line)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        kind = obj.get("kind")
        if kind == "Error" and obj.get("phase") == "Failed" and obj.get("container"):
            # The agent's view of one image's failed pull: kubelet retries it.
            if self.follow:
                return True
            # A snapshot ends with kubelet's failure (it has the registry's text) if
            # there is one, else this one unless it is an earlier attempt's.
            if not self.merger.agent_failure_stale(obj):
                self._agent_failure = obj
            return None
        if kind == "Summary" and self.merger.hold_summary(obj):
            # Present, but kubelet pulls again: follow that pull (ask the agent again);
            # a snapshot ends with a Summary of what it shows.
            self._held = self.follow
            return self.follow
        if self.merger.queued(obj):
            await self._refresh_node_view(node)
        if kind == "Summary":
            self._settle()
        self._publish_merged(obj)
        return False if is_terminal(obj) else None

    def _settle(self) -> None:
        """Before the agent's Summary ends the stream: an object the merge held back
        from a final phase (a layer already present reads as Pulling while kubelet
        pulls) gets its last word from the runtime, as kubelet's Pulled event may
        come after the Summary."""
        for key, obj in list(self._raw.items()):
            phase = obj.get("phase")
            if key in self._placeholders or self._image_row(obj):
                # the image's phase: kubelet's, or its layers'
                said = self.merger.apply(obj).get("phase")
                phase = said if said in PRESENT else layerset.image_phase(self._raw, obj) \
                    or phase
            if phase in PRESENT and self._sent.get(key, {}).get("phase") != phase:
                self._sent[key] = settled = {**self.merger.apply(obj), "phase": phase,
                                             "time": now()}
                self._publish(settled)

    def _image_row(self, obj: dict[str, Any]) -> bool:
        """An image-level object at layer granularity: sent before the manifest was
        known, it is the image's row; it ends with the image, not as it was then."""
        return self.granularity == "layer" and not obj.get("layer") and bool(obj.get("image"))

    def _held_back(self, obj: dict[str, Any]) -> bool:
        """A layer of an image kubelet is about to pull that the runtime shows only as
        present: which layers that pull brings is not known yet (layerset)."""
        return self.merger.pull_ahead(obj) and layerset.unpulled(self._raw, obj)

    def _publish_merged(self, obj: dict[str, Any], *, merge: bool = True) -> None:
        if obj.get("kind") != "Progress":
            self._publish(self.merger.apply(obj) if merge else obj)
            return
        key = object_key(obj)
        for old in layerset.replaced(self._raw, obj):  # the layers of a manifest left
            self._raw.pop(old, None)
            self._sent.pop(old, None)
        self._raw[key] = obj
        if merge and self._held_back(obj):
            stand_in = layerset.placeholder(obj)
            image_key = object_key(stand_in)
            if image_key not in self._raw:
                self._placeholders.add(image_key)
                self._publish_merged(stand_in)
            return
        merged = self.merger.apply(obj) if merge else obj
        self._sent[key] = merged
        self._publish(merged)
        if merge:  # the manifest's layers held back so far go out with it
            for k in layerset.siblings(self._raw, obj):
                if k not in self._sent:
                    self._sent[k] = sib = self.merger.apply(self._raw[k])
                    self._publish({**sib, "time": now()})

    def _any_queued(self) -> bool:
        return any(self.merger.queued(o) for o in self._raw.values())

    async def _remerge(self, node: str) -> None:
        """Publish again the objects whose merged form changed without agent news."""
        if self._any_queued():
            await self._refresh_node_view(node)
        for key, obj in list(self._raw.items()):
            if obj.get("phase") == "Unscheduled" or self._held_back(obj):
                continue
            merged = self.merger.apply(obj)
            if {**merged, "time": ""} != {**self._sent.get(key, {}), "time": ""}:
                self._sent[key] = merged
                self._publish({**merged, "time": now()})

    async def _refresh_node_view(self, node: str) -> None:
        now = self.loop.time()
        if now - self._node_view_at < NODE_VIEW_INTERVAL:
            return
        self._node_view_at = now
        try:
            self.merger.node_view = await fetch_node_view(self.agent, node, self.user)
        except StatusError:
            self.merger.node_view = None
            return
        ask = self._may_see_node_pulls
        if ask is not None and self.merger.others_pulling():
            # One review per stream, and only when other pods' pulls would show.
            self._may_see_node_pulls = None
            self.merger.see_node_pulls = await ask()
