"""Kubernetes objects as tests need them: one place that shapes a Pod."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from tests.agent.agentserver import NODE


def pod_object(name: str, containers: Sequence[tuple[str, str]], *, node: str = NODE,
               uid: str | None = None, namespace: str = "default",
               init: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": n, "image": i} for n, i in containers]}
    if init:
        spec["initContainers"] = [{"name": n, "image": i} for n, i in init]
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
            "spec": spec, "status": {}}
