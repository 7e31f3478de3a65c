"""A scripted agent and a pod in the fake kube-apiserver, for the Producer's tests.

The pod and its events are served by FakeKube and read through the real PodWatch
(list + watch); only the agent is a script: each progress request gets the next
queued stream, whose lines the test feeds while the producer runs.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aggapi.apiserver.imagepullprogress.fanout import Broadcast
from aggapi.apiserver.imagepullprogress.objects import is_terminal, object_key
from aggapi.apiserver.imagepullprogress.podwatch import PodWatch, PodWatchHub
from aggapi.apiserver.podsources import Sources
from aggapi.wire import AGENT_NODE_PULLS_PATH
from tests import kubeobjects
from tests.framework.fakekube import FakeKube

NODE = "node-a"


class Lines:
    """An agent response body: NDJSON lines fed by the test; ``end()`` is EOF."""

    def __init__(self) -> None:
        self._q: asyncio.Queue[bytes] = asyncio.Queue()
        self.closed = False

    def send(self, *objs: dict[str, Any]) -> None:
        for o in objs:
            self._q.put_nowait(json.dumps(o).encode() + b"\n")

    def end(self) -> None:
        self._q.put_nowait(b"")

    async def readline(self) -> bytes:
        return await self._q.get()


class _Response:
    def __init__(self, lines: Lines | None = None, body: Any = None) -> None:
        self.content = lines
        self._body = body

    async def json(self, content_type: str | None = None) -> Any:
        return self._body

    def close(self) -> None:
        if self.content is not None:
            self.content.closed = True

    def release(self) -> None:
        pass


@dataclass
class ScriptedAgent:
    node_view: dict[str, Any] = field(default_factory=dict)
    streams: asyncio.Queue[Lines] = field(default_factory=asyncio.Queue)
    opened: list[dict[str, Any]] = field(default_factory=list)

    def stream(self) -> Lines:
        """The body the next progress request gets."""
        lines = Lines()
        self.streams.put_nowait(lines)
        return lines

    async def open(self, method: str, path: str, **kw: Any) -> _Response:
        if path == AGENT_NODE_PULLS_PATH:
            return _Response(body=json.loads(json.dumps(self.node_view)))
        self.opened.append(kw)
        return _Response(await self.streams.get())


def pod_object(name: str = "p", containers: tuple[tuple[str, str], ...] = (("app", "reg/app:1"),),
               *, namespace: str = "default", node: str = NODE,
               init: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """tests.kubeobjects.pod_object with this suite's defaults (one app container)."""
    return kubeobjects.pod_object(name, containers, namespace=namespace, node=node, init=init)


def event(pod: dict[str, Any], reason: str, container: str, message: str, t: str, *,
          count: int = 1, name: str = "") -> dict[str, Any]:
    """A core/v1 Event as kubelet's recorder writes it (deduplicated: ``count``)."""
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name or f"{meta['name']}.{uuid.uuid4().hex[:8]}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               "fieldPath": f"spec.containers{{{container}}}"},
            "reason": reason, "message": message, "lastTimestamp": t, "count": count,
            "type": "Normal",
            "source": {"component": "kubelet", "host": pod["spec"].get("nodeName", "")}}


def progress(container: str, image: str, phase: str, prog: int | None = -1,
             total: int | None = -1, layer: str = "", error: str = "") -> dict[str, Any]:
    return {"kind": "Progress", "container": container, "image": image, "layer": layer,
            "phase": phase, "progress": prog, "total": total, "error": error,
            "bytesPerSecond": None, "etaSeconds": None, "time": "2026-01-01T00:00:00.000Z"}


def done_summary(container: str, image: str, prog: int | None, total: int | None
                 ) -> dict[str, Any]:
    """The agent's Summary of a one-image pod whose image arrived."""
    return {"kind": "Summary", "phase": "Done", "progress": prog, "total": total,
            "images": [{"container": container, "image": image, "phase": "Done"}]}


@dataclass
class Collected:
    objs: list[dict[str, Any]]

    def phases(self, container: str = "app") -> list[str]:
        """The container's phases as sent, repeats collapsed."""
        out: list[str] = []
        for o in self.objs:
            if o.get("kind") == "Progress" and o.get("container") == container \
                    and (not out or out[-1] != o["phase"]):
                out.append(o["phase"])
        return out

    def finals(self) -> list[dict[str, Any]]:
        return [o for o in self.objs if is_terminal(o)]


def new_broadcast() -> Broadcast:
    return Broadcast(object_key, is_terminal)


async def read_all(bc: Broadcast, sink: list[dict[str, Any]]) -> None:
    since = -1
    while not bc.drained(since):
        items = await bc.read(since, 0.5)
        for i in items:
            sink.append(dict(i.obj))
        if items:
            since = items[-1].seq


async def watch_of(kube: FakeKube, pod: dict[str, Any]) -> AsyncIterator[PodWatch]:
    meta = pod["metadata"]
    async with kube.kube_client() as api:
        sources = Sources(api, linger=0)
        try:
            async with PodWatchHub(sources).watch(meta["namespace"], meta["name"]) as pw:
                await pw.synced(5)
                yield pw
        finally:
            await sources.close()
