"""Which core/v1 Events count as kubelet's: pull progress reads Pulling/Pulled/Failed/
BackOff of a pod's containers from its Events, and anyone allowed to create Events in
the pod's namespace could otherwise write a pull state for it.

kubelet reports as component ``kubelet`` from host <its node> (``source``, and in
``reportingComponent``/``reportingInstance`` since events.k8s.io/v1 mirrored them). An
Event counts only when every one of those fields that is set says so, and the host is
the pod's node. Event fields are written by the client, so this raises the bar (a
tenant's hand-made Event must claim to be kubelet on the pod's node, in an object any
auditor sees) rather than proves authorship.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KUBELET = "kubelet"


def from_kubelet(event: Mapping[str, Any], node: str | None) -> bool:
    """Whether ``event`` says kubelet on ``node`` reported it (``node`` None: the pod is
    not scheduled, any host)."""
    source = event.get("source") or {}
    components = [c for c in (source.get("component"), event.get("reportingComponent")) if c]
    if not components or any(c != KUBELET for c in components):
        return False
    hosts = [h for h in (source.get("host"), event.get("reportingInstance")) if h]
    if node is None:
        return True
    return bool(hosts) and all(h == node for h in hosts)
