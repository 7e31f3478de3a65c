"""Which pods image-pull-progress follows: a pod, a workload's pods, a selector, a node.

A workload (``deployment/web`` and the like) is resolved to its label selector the way
``kubectl rollout status`` does; the selected pods' podimagepulls are then listed and
watched (``aggapi.plugins.collection``), so pods that appear later (a rollout's new
replicas) are followed too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aggapi.client.connection import Connection
from aggapi.client.errors import ClientError, TransferError

# kind/NAME prefixes kubectl accepts for these workloads -> API group path and resource.
WORKLOADS = {
    "deployment": ("/apis/apps/v1", "deployments"), "deploy": ("/apis/apps/v1", "deployments"),
    "statefulset": ("/apis/apps/v1", "statefulsets"), "sts": ("/apis/apps/v1", "statefulsets"),
    "daemonset": ("/apis/apps/v1", "daemonsets"), "ds": ("/apis/apps/v1", "daemonsets"),
    "replicaset": ("/apis/apps/v1", "replicasets"), "rs": ("/apis/apps/v1", "replicasets"),
    "job": ("/apis/batch/v1", "jobs"),
}
POD_KINDS = ("pod", "pods", "po")
Obj = dict[str, Any]


@dataclass(frozen=True)
class Target:
    """One pod (``pod``), or a set of pods by selectors in a namespace (None: all)."""

    pod: str = ""
    workload: tuple[str, str] | None = None  # (kind, name)
    label_selector: str = ""
    field_selector: str = ""
    all_namespaces: bool = False

    @property
    def single(self) -> bool:
        return bool(self.pod)


def parse_target(arg: str | None, *, selector: str | None, node: str | None,
                 all_namespaces: bool) -> Target:
    """The target from the command line; ClientError for a combination kubectl refuses."""
    fields = f"spec.nodeName={node}" if node else ""
    if arg:
        kind, slash, name = arg.partition("/")
        if not slash:
            kind, name = "pod", arg
        kind = kind.lower()
        if not name:
            raise ClientError.from_message(f"arguments in resource/name form must have a "
                                           f"single resource and name: {arg!r}")
        if selector or node or all_namespaces:
            raise ClientError.from_message("a resource name cannot be combined with "
                                           "-l, --node or -A")
        if kind in POD_KINDS:
            return Target(pod=name)
        if kind.split(".")[0] in WORKLOADS:
            return Target(workload=(kind.split(".")[0], name))
        raise ClientError.from_message(
            f"unsupported resource type {kind!r}: use a pod, deployment/, statefulset/, "
            "daemonset/, replicaset/ or job/")
    if not (selector or node or all_namespaces):
        raise ClientError.from_message("give a pod, TYPE/NAME, -l SELECTOR, --node NODE or -A")
    return Target(label_selector=selector or "", field_selector=fields,
                  all_namespaces=all_namespaces)


def selector_string(sel: Mapping[str, Any]) -> str:
    """A LabelSelector object (matchLabels, matchExpressions) as a selector string."""
    parts = [f"{k}={v}" for k, v in sorted((sel.get("matchLabels") or {}).items())]
    for e in sel.get("matchExpressions") or []:
        key, op, vals = e.get("key", ""), e.get("operator", ""), e.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(vals)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(vals)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise ClientError.from_message(f"unknown selector operator {op!r}")
    return ",".join(parts)


def _decode(body: bytes) -> Any:
    return json.loads(body)


async def get_json(conn: Connection, path: str, params: list[tuple[str, str]] | None = None,
                   ) -> Obj:
    async with conn.request("GET", path, params=params,
                            headers={"Accept": "application/json"}) as resp:
        body = await resp.read()
    # Parsed in a thread: a pod list can be megabytes of someone else's JSON.
    doc = await asyncio.to_thread(_decode, body)
    if not isinstance(doc, dict):
        raise TransferError.from_message(f"{path}: the answer is not an object")
    return doc


async def resolve(conn: Connection, target: Target, namespace: str) -> Target:
    """A workload becomes the label selector of its pods (spec.selector)."""
    if target.workload is None:
        return target
    kind, name = target.workload
    group, resource = WORKLOADS[kind]
    obj = await get_json(conn, f"{group}/namespaces/{namespace}/{resource}/{name}")
    sel = (obj.get("spec") or {}).get("selector")
    if not isinstance(sel, dict) or not (sel.get("matchLabels") or sel.get("matchExpressions")):
        raise ClientError.from_message(f"{kind}/{name} has no pod selector")
    return Target(workload=target.workload, label_selector=selector_string(sel))
