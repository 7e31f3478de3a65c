"""What the shared pod informers keep of a pod: the fields the collections and the
per-pod progress streams read, nothing else (as client-go's SetTransform).

A cluster's worth of pods is held for as long as a source runs (the leader's whole
term): parsed, a Deployment's pod of 1.2 KB of JSON took
about 8.6 KiB of Python objects (418 MiB for 50,000 pods), most of it env, ports,
resources, conditions and owner references nobody here reads; slim, 2.9 KiB. Readers:
``pods.target_from_pod``/``containers_of`` (names, images, image volumes),
``merge.Merger.update`` (imagePullPolicy, image volumes' pullPolicy),
``pullstate.views``/``kubelet_events`` (nodeName, uid, container statuses' name,
state and imageID), the collections' objects (name, namespace, uid,
creationTimestamp, labels) and the stream's producer (uid, nodeName).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

META = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp",
        "deletionTimestamp", "labels")
CONTAINER = ("name", "image", "imagePullPolicy")
STATUS = ("name", "image", "imageID", "state")
CONTAINER_LISTS = ("initContainers", "containers", "ephemeralContainers")
STATUS_LISTS = ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses")


def _pick(obj: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(obj, Mapping):
        return obj  # (not a pod's shape: kept as is, the readers cope with it)
    return {k: obj[k] for k in keys if k in obj}


def _each(items: Any, keys: tuple[str, ...]) -> Any:
    return [_pick(i, keys) for i in items] if isinstance(items, list) else items


def slim_pod(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` with only the fields read here (a new dict; ``pod`` is not changed)."""
    out: dict[str, Any] = {}
    if "metadata" in pod:
        out["metadata"] = _pick(pod["metadata"], META)
    spec = pod.get("spec")
    if isinstance(spec, Mapping):
        slim: dict[str, Any] = {k: _each(spec[k], CONTAINER) for k in CONTAINER_LISTS
                                if k in spec}
        if "nodeName" in spec:
            slim["nodeName"] = spec["nodeName"]
        volumes = spec.get("volumes")
        if isinstance(volumes, list):  # only image volumes are pulled
            images = [_pick(v, ("name", "image")) for v in volumes
                      if not isinstance(v, Mapping) or "image" in v]
            if images:
                slim["volumes"] = images
        out["spec"] = slim
    elif "spec" in pod:
        out["spec"] = spec
    status = pod.get("status")
    if isinstance(status, Mapping):
        kept: dict[str, Any] = {k: _each(status[k], STATUS) for k in STATUS_LISTS
                                if k in status}
        if "phase" in status:
            kept["phase"] = status["phase"]
        out["status"] = kept
    elif "status" in pod:
        out["status"] = status
    return out
