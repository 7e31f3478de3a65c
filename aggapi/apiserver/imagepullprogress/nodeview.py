"""nodes/imagepulls: every in-flight pull on a node with the pods waiting for it,
and the node view the producer reads while a pull looks queued.

The body is a Kubernetes object, as kube's own subresources answer (Scale, Eviction):
``apiVersion``, ``kind: NodeImagePulls``, ``metadata.name`` the node, then the
agent's node view as it always was (``node``, ``slots``, ``pulls``, ...), so readers
of the old body read this one. A node that no agent pod is bound to is a 404, as
``nodeimagepulls`` says; one whose agent is not ready yet stays a 503 to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from aiohttp import web

from aggapi import GROUP_VERSION, imageref
from aggapi.apiserver.agentclient import AgentClient, require_agent
from aggapi.apiserver.discovery import KIND_NODE_IMAGE_PULLS
from aggapi.apiserver.pods import PodTarget, pods_on_node
from aggapi.apiserver.requestinfo import INFO
from aggapi.apiserver.user import USER
from aggapi.kube.client import KubeClient
from aggapi.status import not_found
from aggapi.wire import AGENT_NODE_PULLS_PATH, OP_NODE_PULLS

SYNC_TIMEOUT = 5.0  # seconds a first request waits for the list of agents


class Directory(Protocol):
    """What of aggapi.apiserver.agents.AgentDirectory the 404 needs."""

    @property
    def synced(self) -> bool: ...

    async def wait_synced(self, timeout: float) -> None: ...

    def knows(self, node: str) -> bool: ...

    def created(self, node: str) -> str: ...


async def require_node(directory: Directory, node: str) -> None:
    """404 NotFound naming the node when no agent pod is bound to it (once the list of
    agents is in; before that, the agent lookup's 503 says to retry)."""
    if not directory.synced:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await directory.wait_synced(SYNC_TIMEOUT)
    if directory.synced and not directory.knows(node):
        raise not_found("nodes", node)


def node_pulls_object(node: str, view: Mapping[str, Any], created: str) -> dict[str, Any]:
    """The NodeImagePulls object of ``node`` from its agent's view (pods added)."""
    # linkTicks: the agent's received bytes for the leader's link judgement, not the API's.
    rest = {k: v for k, v in view.items()
            if k not in ("apiVersion", "kind", "metadata", "linkTicks")}
    return {"apiVersion": GROUP_VERSION, "kind": KIND_NODE_IMAGE_PULLS,
            "metadata": {"name": node, **({"creationTimestamp": created} if created else {})},
            **rest, "node": node, "slots": slots_of(view)}


async def fetch_node_view(agent: AgentClient, node: str, subject: str, *,
                          reuse: bool = False) -> dict[str, Any]:
    """``reuse``: with a token signed for many reads (the shared polls'), not per read."""
    resp = await agent.open("GET", AGENT_NODE_PULLS_PATH, node=node, subject=subject,
                            operation=OP_NODE_PULLS, reuse=reuse)
    try:
        data: dict[str, Any] = await resp.json(content_type=None)
        return data
    finally:
        resp.release()


def slots_of(view: Mapping[str, Any]) -> dict[str, Any]:
    """The node's pull slots (KEP-3673) as ``{limit, serialize, source, error}``,
    from the agent's ``slots`` or from older agents' ``kubelet`` member. ``limit``
    is an int or null (unknown, or no limit: ``error`` then says which)."""
    raw = view.get("slots")
    if isinstance(raw, Mapping):
        limit, serialize = raw.get("limit"), raw.get("serialize")
        source, error = raw.get("source"), raw.get("error")
    else:
        old = view.get("kubelet")
        old = old if isinstance(old, Mapping) else {}
        limit, serialize = old.get("parallelSlots"), old.get("serializeImagePulls")
        source, error = old.get("source"), old.get("error")
    return {"limit": limit if isinstance(limit, int) and not isinstance(limit, bool)
            and limit > 0 else None,
            "serialize": serialize if isinstance(serialize, bool) else None,
            "source": str(source or ""), "error": str(error or "")}


class NodePullsHandler:
    """Every in-flight pull on a node, with the pods on that node waiting for it."""

    def __init__(self, kube_api: KubeClient, agent: AgentClient | None) -> None:
        self.kube_api = kube_api
        self.agent = agent

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        node = request[INFO].name  # the node that was authorized
        agent = require_agent(self.agent)
        await require_node(agent.directory, node)
        view = await fetch_node_view(agent, node, request[USER].name)
        pods = await pods_on_node(self.kube_api, node)
        for pull in view.get("pulls") or []:
            pull["pods"] = _waiting_pods(pull, pods)
        return web.json_response(node_pulls_object(node, view,
                                                   agent.directory.created(node)))


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
