"""A scripted agent for the collections' tests: each node's view is what the test
set last; every read is counted (one poll per node, however many pods)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any, cast

from aggapi.apiserver.agentclient import AgentClient
from aggapi.apiserver.collections.feedset import Feeds
from aggapi.apiserver.podsources import Sources
from aggapi.kube.client import KubeClient
from tests import kubeobjects


class _Response:
    def __init__(self, body: Any) -> None:
        self._body = body

    async def json(self, content_type: str | None = None) -> Any:
        return self._body

    def release(self) -> None:
        pass


class FakeDirectory:
    def __init__(self, agent: FakeAgent) -> None:
        self._agent = agent

    async def wait_synced(self, timeout: float) -> None:
        return None

    def nodes(self) -> dict[str, object]:
        return dict.fromkeys(self._agent.views)

    def created(self, node: str) -> str:
        return "2026-01-01T00:00:00Z" if node in self._agent.views else ""


class FakeAgent:
    def __init__(self) -> None:
        self.views: dict[str, dict[str, Any]] = {}
        self.reads: dict[str, int] = {}
        self.stalled: set[str] = set()  # nodes whose agent never answers
        self.directory = FakeDirectory(self)
        # PUTs (the leader's link peers): (node, path, operation, body)
        self.puts: list[tuple[str, str, str, Any]] = []

    async def open(self, method: str, path: str, *, node: str, **kw: Any) -> _Response:
        if method == "PUT":
            self.puts.append((node, path, str(kw.get("operation")), kw.get("data")))
            return _Response(None)
        self.reads[node] = self.reads.get(node, 0) + 1
        if node in self.stalled:
            await asyncio.Event().wait()
        return _Response(copy.deepcopy(self.views.get(node, {})))


def node_view(*pulls: Mapping[str, Any], limit: int | None = None) -> dict[str, Any]:
    """The agent's /v1/imagepulls answer: ``pulls`` in flight, ``limit`` slots."""
    return {"kind": "NodeImagePulls", "pulls": [dict(p) for p in pulls],
            "inFlight": len(pulls),
            "slots": {"limit": limit, "serialize": None, "source": "test", "error": ""},
            "slotsFree": None if limit is None else max(limit - len(pulls), 0),
            "linkBytesPerSecond": None, "error": "", "time": "2026-01-01T00:00:00Z"}


def pull(repo: str, *, progress: int, total: int, rate: float | None = None,
         phase: str = "Downloading") -> dict[str, Any]:
    return {"lease": f"l-{repo}", "startedAt": "2026-01-01T00:00:00Z", "phase": phase,
            "repositories": [repo], "images": [], "digest": "", "progress": progress,
            "total": total, "bytesPerSecond": rate, "downloadingLayers": 1}


def pod(name: str, image: str = "registry.test/app:1", *, namespace: str = "ns1",
        node: str = "node-a", labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    obj = kubeobjects.pod_object(name, [("app", image)], node=node, namespace=namespace,
                                 uid=f"uid-{namespace}-{name}")
    obj["metadata"]["labels"] = dict(labels or {})
    return obj


def event(pod_obj: Mapping[str, Any], reason: str, message: str, *, n: int = 0,
          when: str = "2026-01-01T00:00:01Z") -> dict[str, Any]:
    meta = pod_obj["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{reason.lower()}{n}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               "fieldPath": "spec.containers{app}"},
            "reason": reason, "message": message,
            "source": {"component": "kubelet", "host": pod_obj["spec"].get("nodeName", "")},
            "lastTimestamp": when, "type": "Normal"}


def budgeted_feeds(polls_per_second: float) -> Feeds:
    """Feeds with no kube and a FakeAgent, reading each node every second within a
    budget of ``polls_per_second`` (0: none): for the node reads' pace."""
    return Feeds(Sources(cast(KubeClient, None), linger=1.0), cast(AgentClient, FakeAgent()),
                 linger=1.0, poll_interval=1.0, polls_per_second=polls_per_second)
