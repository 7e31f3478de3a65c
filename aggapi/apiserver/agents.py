"""Node -> agent address, from the EndpointSlices of the agent Service.

A watch-backed cache (one list+watch for the whole process, not one call per
request). Only ready endpoints count; the slice's ``nodeName`` says which node an
agent serves, which is how KubeVirt's virt-api finds its virt-handler too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.kube import KubeClient, path_segment
from aggapi.kubewatch import Informer
from aggapi.status import StatusError


@dataclass(frozen=True)
class AgentEndpoint:
    node: str
    address: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"https://{host}:{self.port}"


def endpoints_from_slice(es: Mapping[str, Any], port_name: str) -> list[AgentEndpoint]:
    ports = es.get("ports") or []
    port = next((p.get("port") for p in ports if (p.get("name") or "") == port_name), None)
    if port is None and len(ports) == 1:
        port = ports[0].get("port")
    if not port:
        return []
    out = []
    for ep in es.get("endpoints") or []:
        cond = ep.get("conditions") or {}
        # Per the EndpointSlice API, a nil "ready" means ready.
        if cond.get("ready") is False or cond.get("terminating"):
            continue
        node = ep.get("nodeName")
        for addr in ep.get("addresses") or []:
            if node and addr:
                out.append(AgentEndpoint(node=node, address=addr, port=int(port)))
    return out


class AgentDirectory:
    """Which agent serves which node; ``lookup`` is a dict read."""

    def __init__(self, api: KubeClient, *, namespace: str, service: str,
                 port_name: str = "https") -> None:
        self._port_name = port_name
        self._by_node: dict[str, AgentEndpoint] = {}
        self._informer = Informer(
            api,
            f"/apis/discovery.k8s.io/v1/namespaces/{path_segment(namespace)}/endpointslices",
            {"labelSelector": f"kubernetes.io/service-name={service}"},
        )
        self._informer.add_listener(lambda _kind, _obj: self._rebuild())
        self.service = f"{namespace}/{service}"

    def start(self) -> None:
        self._informer.start()

    async def stop(self) -> None:
        await self._informer.stop()

    @property
    def synced(self) -> bool:
        return self._informer.synced.is_set()

    def _rebuild(self) -> None:
        by_node: dict[str, AgentEndpoint] = {}
        for es in self._informer.items.values():
            for ep in endpoints_from_slice(es, self._port_name):
                by_node.setdefault(ep.node, ep)
        self._by_node = by_node

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
