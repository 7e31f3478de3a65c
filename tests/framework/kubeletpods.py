"""Pods for the harness's kubelet: a manifest bound to a node, labelled so the harness can
find and remove them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

HARNESS_LABEL = "aggapi.io/harness"


def pod_manifest(name: str, containers: Sequence[Mapping[str, Any]], *, node: str,
                 namespace: str = "default", init_containers: Sequence[Mapping[str, Any]] = (),
                 host_network: bool = False, pull_policy: str = "IfNotPresent",
                 labels: Mapping[str, str] | None = None,
                 volumes: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """A pod bound to ``node`` (kube-scheduler not asked), quick to delete, no token."""

    def fill(c: Mapping[str, Any]) -> dict[str, Any]:
        return {"imagePullPolicy": pull_policy, **c}

    spec: dict[str, Any] = {
        "nodeName": node, "containers": [fill(c) for c in containers],
        "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
        "enableServiceLinks": False, "restartPolicy": "Always", "dnsPolicy": "Default",
    }
    if init_containers:
        spec["initContainers"] = [fill(c) for c in init_containers]
    if host_network:
        spec["hostNetwork"] = True
    if volumes:
        spec["volumes"] = [dict(v) for v in volumes]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {HARNESS_LABEL: "pod", **(labels or {})}},
            "spec": spec}
