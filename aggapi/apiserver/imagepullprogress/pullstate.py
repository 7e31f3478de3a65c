"""What Kubernetes itself says about a pod's image pulls: scheduling, kubelet events
and container statuses, reduced to one view per container.

The agent sees bytes; only Kubernetes sees kubelet's decisions (a pull started, a
pull failed with the registry's text, back-off). The apiserver merges both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aggapi.capability import ContainerRef

# Kubelet's event reasons for image pulls (pkg/kubelet/events).
PULLING, PULLED, FAILED, BACKOFF = "Pulling", "Pulled", "Failed", "BackOff"
# Waiting reasons in container statuses that mean the pull failed.
PULL_ERROR_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                      "ErrImageNeverPull", "RegistryUnavailable", "SignatureValidationFailed"}

_FIELD_PATH = re.compile(r"^spec\.(initContainers|containers|ephemeralContainers)\{(.+)\}$")
_QUOTED = re.compile(r'"([^"]+)"')


@dataclass(frozen=True)
class K8sView:
    """Kubernetes' view of one container's image."""

    phase: str = ""          # "", Unscheduled, Pulling, Pulled, Failed, BackOff
    error: str = ""          # the registry's / kubelet's error text
    already_present: bool = False
    since: str = ""          # timestamp of the event that set the phase


def _container_of(ev: Mapping[str, Any]) -> str | None:
    m = _FIELD_PATH.match((ev.get("involvedObject") or {}).get("fieldPath") or "")
    return m.group(2) if m else None


def _image_of(ev: Mapping[str, Any]) -> str | None:
    m = _QUOTED.search(ev.get("message") or "")
    return m.group(1) if m else None


def event_time(ev: Mapping[str, Any]) -> str:
    return str(ev.get("lastTimestamp") or ev.get("eventTime")
               or (ev.get("metadata") or {}).get("creationTimestamp") or "")


def _statuses(pod: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    st = pod.get("status") or {}
    out: dict[str, Mapping[str, Any]] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in st.get(key) or ():
            out[cs.get("name", "")] = cs
    return out


def views(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
          containers: Sequence[ContainerRef]) -> dict[str, K8sView]:
    """One K8sView per container name, from the pod and its events (oldest first)."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return {c.name: K8sView(phase="Unscheduled") for c in containers}

    by_name = {c.name: c for c in containers}
    latest: dict[str, K8sView] = {}
    for ev in sorted(events, key=event_time):
        reason = ev.get("reason") or ""
        if reason not in (PULLING, PULLED, FAILED, BACKOFF):
            continue
        name = _container_of(ev)
        if name is None:  # image volumes: match by the image in the message
            image = _image_of(ev)
            name = next((c.name for c in containers if c.image == image), None)
        if name not in by_name:
            continue
        message = ev.get("message") or ""
        when = event_time(ev)
        if reason == PULLING:
            latest[name] = K8sView(phase="Pulling", since=when)
        elif reason == PULLED:
            latest[name] = K8sView(phase="Pulled", since=when,
                                   already_present="already present" in message)
        elif reason == FAILED and (message.startswith("Error: ") or "pull" in message.lower()):
            # kubelet follows 'Failed to pull image "x": <registry text>' with a bare
            # 'Error: ErrImagePull': keep the registry's text, it is what users need.
            prev = latest.get(name)
            keep = prev.error if prev and prev.error and message.startswith("Error: ") else ""
            phase = "BackOff" if "ImagePullBackOff" in message else "Failed"
            latest[name] = K8sView(phase=phase, error=keep or _strip_prefix(message),
                                   since=when)
        elif reason == BACKOFF and "pull" in message.lower():
            prev = latest.get(name)
            latest[name] = K8sView(phase="BackOff", since=when,
                                   error=prev.error if prev and prev.error else message)

    # Container statuses are authoritative for the present: a running container's
    # image is there; a waiting reason names a pull failure with kubelet's text.
    for name, cs in _statuses(pod).items():
        if name not in by_name:
            continue
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason") or ""
        if reason in PULL_ERROR_REASONS:
            prev = latest.get(name, K8sView())
            phase = "BackOff" if reason == "ImagePullBackOff" else "Failed"
            latest[name] = K8sView(phase=phase, since=prev.since,
                                   error=prev.error or waiting.get("message") or reason)
        elif cs.get("imageID") and latest.get(name, K8sView()).phase in ("", "Pulling"):
            latest[name] = K8sView(phase="Pulled", since=latest.get(name, K8sView()).since)
    return latest


def _strip_prefix(message: str) -> str:
    """'Failed to pull image "x": rpc error: ...' -> the part after the image."""
    m = re.match(r'^Failed to pull image "[^"]*": (.*)$', message, re.S)
    return m.group(1) if m else message
