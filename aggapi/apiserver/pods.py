"""Pod lookup: the pod's node, uid and the images it pulls, from the Kubernetes API.

Everything the agent is told about a pod comes from here (through the signed
capability), so the agent never needs Kubernetes API permissions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from aggapi.auth.capability import ContainerRef
from aggapi.kube.client import KubeClient, KubeError, path_segment
from aggapi.status import StatusError, not_found


@dataclass(frozen=True)
class PodTarget:
    namespace: str
    name: str
    uid: str
    node: str  # "" while unscheduled
    containers: tuple[ContainerRef, ...]
    raw: Mapping[str, Any]

    def select(self, names: Sequence[str]) -> tuple[ContainerRef, ...]:
        """The containers named (all when ``names`` is empty), and image volumes of
        those names (a volume may be named like a container); 400 for unknown names."""
        if not names:
            return self.containers
        known = {c.name for c in self.containers}
        missing = [n for n in names if n not in known]
        if missing:
            raise StatusError(
                400,
                f"container {missing[0]!r} is not valid for pod {self.name!r}; "
                f"valid names: {', '.join(sorted(known))}",
            )
        wanted = set(names)
        return tuple(c for c in self.containers if c.name in wanted)


def containers_of(spec: Mapping[str, Any]) -> tuple[ContainerRef, ...]:
    """Every image the pod pulls: init, regular and ephemeral containers, image volumes."""
    out: list[ContainerRef] = []

    def add(items: Iterable[Mapping[str, Any]] | None, kind: str) -> None:
        for c in items or ():
            if c.get("image"):
                out.append(ContainerRef(name=c["name"], image=c["image"], kind=kind))

    add(spec.get("initContainers"), "init")
    add(spec.get("containers"), "regular")
    add(spec.get("ephemeralContainers"), "ephemeral")
    for vol in spec.get("volumes") or ():
        ref = (vol.get("image") or {}).get("reference")
        if ref:
            out.append(ContainerRef(name=vol["name"], image=ref, kind="imagevolume"))
    return tuple(out)


def target_from_pod(pod: Mapping[str, Any]) -> PodTarget:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    return PodTarget(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        node=spec.get("nodeName") or "",
        containers=containers_of(spec),
        raw=pod,
    )


async def get_pod(api: KubeClient, namespace: str, name: str) -> dict[str, Any]:
    """GET the pod as a plain dict; 404 Status if missing, 503 if the API fails.

    Raw JSON, never typed models: those drop fields newer than the client (image
    volumes, say), and the pod is what we sign for the agent.
    """
    try:
        path = f"/api/v1/namespaces/{path_segment(namespace)}/pods/{path_segment(name)}"
    except ValueError:
        raise not_found("pods", name) from None
    try:
        return await api.get(path)
    except KubeError as exc:
        if exc.status == 404:
            raise not_found("pods", name) from None
        if exc.status in (401, 403):
            # Our own service account lacks rights: an operator problem, not the user's.
            raise StatusError(503, f"aggapi cannot read pods: {exc.reason}",
                              retry_after=5) from None
        raise StatusError(503, f"reading pod {namespace}/{name}: {exc.reason}",
                          retry_after=2) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise StatusError(503, f"reading pod {namespace}/{name}: {exc!r}",
                          retry_after=2) from None


async def lookup(api: KubeClient, namespace: str, name: str) -> PodTarget:
    return target_from_pod(await get_pod(api, namespace, name))


async def pods_on_node(api: KubeClient, node: str) -> list[PodTarget]:
    """Every pod bound to ``node``, across namespaces; 503 if the API fails."""
    try:
        data = await api.get("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})
    except (KubeError, aiohttp.ClientError, TimeoutError) as exc:
        reason = exc.reason if isinstance(exc, KubeError) else repr(exc)
        raise StatusError(503, f"listing pods on node {node}: {reason}",
                          retry_after=2) from None
    return [target_from_pod(p) for p in data.get("items") or []]
