"""Node -> agent address, from the EndpointSlices of the agent Service.

A watch-backed cache (one list+watch for the whole process, not one call per
request). Ready endpoints count; the slice's ``nodeName`` says which node an agent
serves, which is how KubeVirt's virt-api finds its virt-handler too. A node with no
ready agent falls back to a terminating one that still serves, as kube-proxy does
(KEP-1669): in a surge roll the DaemonSet controller deletes the old agent as soon as
the new pod is Ready, possibly before the slice (or the pod cache) shows the new one
ready, and the old agent keeps serving through its preStop sleep.

An EndpointSlice is only a claim: whoever can write EndpointSlices in the agents'
namespace, or the agent on another node, could point a node's requests (and their
capability tokens) elsewhere. So with ``pod_check`` (the default) an entry counts only
when its ``targetRef`` is a pod, by name and uid, whose controller is the agent
DaemonSet, which runs on that very node (``spec.nodeName``) and has that address. Faking
that takes creating pods in aggapi's namespace, which Pod Security keeps privileged:
already as much as root on a node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.kube.client import KubeClient, path_segment
from aggapi.kube.informer import Informer
from aggapi.status import StatusError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentEndpoint:
    node: str
    address: str
    port: int
    # The EndpointSlice entry's targetRef (a Pod), as the slice names it.
    pod: str = ""
    pod_uid: str = ""
    pod_namespace: str = ""

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"https://{host}:{self.port}"


def endpoints_from_slice(es: Mapping[str, Any], port_name: str, *,
                         terminating: bool = False) -> list[AgentEndpoint]:
    """The slice's ready endpoints; with ``terminating``, instead those terminating
    that still serve."""
    ports = es.get("ports") or []
    port = next((p.get("port") for p in ports if (p.get("name") or "") == port_name), None)
    if port is None and len(ports) == 1:
        port = ports[0].get("port")
    if not port:
        return []
    out = []
    for ep in es.get("endpoints") or []:
        cond = ep.get("conditions") or {}
        if terminating:
            if not (cond.get("terminating") and cond.get("serving")):
                continue
        # Per the EndpointSlice API, a nil "ready" means ready.
        elif cond.get("ready") is False or cond.get("terminating"):
            continue
        node = ep.get("nodeName")
        ref = ep.get("targetRef") or {}
        target = (str(ref.get("name") or ""), str(ref.get("uid") or ""),
                  str(ref.get("namespace") or "")) if ref.get("kind") == "Pod" else ("", "", "")
        for addr in ep.get("addresses") or []:
            if node and addr:
                out.append(AgentEndpoint(node=node, address=addr, port=int(port),
                                         pod=target[0], pod_uid=target[1],
                                         pod_namespace=target[2]))
    return out


def _pod_ips(pod: Mapping[str, Any]) -> set[str]:
    status = pod.get("status") or {}
    ips = {str(p.get("ip")) for p in status.get("podIPs") or () if p.get("ip")}
    if status.get("podIP"):
        ips.add(str(status["podIP"]))
    return ips


def refusal(ep: AgentEndpoint, pods: Mapping[str, Mapping[str, Any]], *, namespace: str,
            daemonset: str, terminating: bool = False) -> str | None:
    """Why ``ep`` is not the agent DaemonSet's pod on ``ep.node`` (None: it is).
    ``pods`` are the pods of the agents' namespace, by name; a ``terminating`` endpoint
    may belong to a pod being deleted."""
    if not ep.pod or not ep.pod_uid:
        return "its targetRef names no pod"
    if ep.pod_namespace not in ("", namespace):
        return f"its pod is in namespace {ep.pod_namespace!r}"
    pod = pods.get(ep.pod)
    meta = (pod or {}).get("metadata") or {}
    if pod is None or meta.get("uid") != ep.pod_uid:
        return f"no pod {ep.pod} with uid {ep.pod_uid}"
    if meta.get("deletionTimestamp") and not terminating:
        return f"pod {ep.pod} is being deleted"
    owner: Mapping[str, Any] = next(
        (o for o in meta.get("ownerReferences") or () if o.get("controller")), {})
    if (owner.get("apiVersion"), owner.get("kind"), owner.get("name")) != (
            "apps/v1", "DaemonSet", daemonset):
        return f"pod {ep.pod} is not controlled by DaemonSet {daemonset}"
    if (pod.get("spec") or {}).get("nodeName") != ep.node:
        return f"pod {ep.pod} runs on {(pod.get('spec') or {}).get('nodeName')!r}, " \
               f"not {ep.node!r}"
    if ep.address not in _pod_ips(pod):
        return f"{ep.address} is not an address of pod {ep.pod}"
    return None


class AgentDirectory:
    """Which agent serves which node; ``lookup`` is a dict read."""

    def __init__(self, api: KubeClient, *, namespace: str, service: str,
                 port_name: str = "https", daemonset: str = "",
                 pod_check: bool = True) -> None:
        self._port_name = port_name
        self._namespace = namespace
        self._daemonset = daemonset or service
        self._by_node: dict[str, AgentEndpoint] = {}
        self._refused: dict[AgentEndpoint, str] = {}
        self._created: dict[str, str] = {}
        ns = path_segment(namespace)
        self._informer = Informer(
            api, f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
            {"labelSelector": f"kubernetes.io/service-name={service}"},
        )
        self._informer.add_listener(lambda _kind, _obj: self._rebuild())
        # The pods of the agents' namespace: what each entry's targetRef must be.
        self._pods = Informer(api, f"/api/v1/namespaces/{ns}/pods") if pod_check else None
        self._informers = [self._informer] + ([self._pods] if self._pods else [])
        if self._pods is not None:
            self._pods.add_listener(lambda _kind, _obj: self._rebuild())
        self.service = f"{namespace}/{service}"

    def start(self) -> None:
        for inf in self._informers:
            inf.start()

    async def stop(self) -> None:
        for inf in self._informers:
            await inf.stop()

    @property
    def synced(self) -> bool:
        return all(inf.synced.is_set() for inf in self._informers)

    def _rebuild(self) -> None:
        by_node: dict[str, AgentEndpoint] = {}
        refused: dict[AgentEndpoint, str] = {}
        pods = None
        if self._pods is not None:
            pods = {(o.get("metadata") or {}).get("name", ""): o
                    for o in self._pods.items.values()}
        # Ready agents first; then, for nodes left without one, terminating ones.
        for terminating in (False, True):
            for es in self._informer.items.values():
                for ep in endpoints_from_slice(es, self._port_name, terminating=terminating):
                    if ep.node in by_node:
                        continue
                    why = None if pods is None else refusal(
                        ep, pods, namespace=self._namespace, daemonset=self._daemonset,
                        terminating=terminating)
                    if why is not None:
                        refused[ep] = why
                        continue
                    by_node[ep.node] = ep
        # When each node's agent pod was created: NodeImagePull's creationTimestamp.
        self._created = {node: str(((pods or {}).get(ep.pod) or {}).get("metadata", {})
                                   .get("creationTimestamp") or "")
                         for node, ep in by_node.items()}
        for ep, why in refused.items():
            if self._refused.get(ep) != why:
                log.warning("ignoring agent endpoint %s for node %s: %s",
                            ep.address, ep.node, why)
        self._by_node, self._refused = by_node, refused

    async def wait_synced(self, timeout: float) -> None:
        """Until the first list of agents is in (TimeoutError after ``timeout``)."""
        await asyncio.wait_for(self._informer.synced.wait(), timeout)

    async def endpoint(self, node: str, sync_timeout: float = 5.0) -> AgentEndpoint:
        """Like :meth:`lookup`, but first waits (briefly) for the initial list."""
        if not self.synced:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._informer.synced.wait(), sync_timeout)
        return self.lookup(node)

    def lookup(self, node: str) -> AgentEndpoint:
        """The node's ready agent, or a 503 the client may retry."""
        ep = self._by_node.get(node)
        if ep is None:
            raise StatusError(
                503,
                f'no ready aggapi agent on node "{node}" (EndpointSlices of service '
                f"{self.service}); is the agent DaemonSet running there?",
                retry_after=5,
            )
        return ep

    def nodes(self) -> dict[str, AgentEndpoint]:
        return dict(self._by_node)

    def created(self, node: str) -> str:
        """When the agent pod serving ``node`` was created ("" when not known)."""
        return self._created.get(node, "")

    def knows(self, node: str) -> bool:
        """Whether any agent pod is bound to ``node``, ready or not: a node without
        one is not a node aggapi serves (404), one whose agent is not ready yet a 503."""
        if node in self._by_node:
            return True
        if self._pods is None:
            return False
        return any((p.get("spec") or {}).get("nodeName") == node and any(
            o.get("controller") and o.get("kind") == "DaemonSet"
            and o.get("name") == self._daemonset
            for o in (p.get("metadata") or {}).get("ownerReferences") or ())
            for p in self._pods.items.values())
