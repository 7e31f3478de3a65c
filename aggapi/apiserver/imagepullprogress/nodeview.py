"""nodes/imagepulls: every in-flight pull on a node with the pods waiting for it,
and the node view the producer reads while a pull looks queued."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from aggapi import imageref
from aggapi.apiserver.agentclient import AgentClient, require_agent
from aggapi.apiserver.pods import PodTarget, pods_on_node
from aggapi.apiserver.requestinfo import INFO
from aggapi.apiserver.user import USER
from aggapi.kube.client import KubeClient
from aggapi.wire import AGENT_NODE_PULLS_PATH, OP_NODE_PULLS


async def fetch_node_view(agent: AgentClient, node: str, subject: str) -> dict[str, Any]:
    resp = await agent.open("GET", AGENT_NODE_PULLS_PATH, node=node, subject=subject,
                            operation=OP_NODE_PULLS)
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
        view = await fetch_node_view(require_agent(self.agent), node, request[USER].name)
        pods = await pods_on_node(self.kube_api, node)
        for pull in view.get("pulls") or []:
            pull["pods"] = _waiting_pods(pull, pods)
        view["slots"] = slots_of(view)
        return web.json_response(view)


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
