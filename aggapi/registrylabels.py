"""Registry hosts as metric label values, for the agents' pull metrics and the
apiserver's fleet view alike (one rule, so their series join on ``registry``).

A host is as containerd's distribution-source labels name it: lower-cased, without a
port (``imageref.ImageRef.host``). Label values are bounded: the first
``MAX_REGISTRIES`` hosts a process sees keep their own value for its whole life (a
series never changes meaning); pulls from further hosts count under ``other``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aggapi import imageref

MAX_REGISTRIES = 32
OTHER = "other"
UNKNOWN = "unknown"  # a pull still resolving its tag names no repository yet


def host_of_repository(repository: str) -> str:
    """``host/path`` (containerd's distribution-source form) -> ``host`` (a port, if
    one is there, goes: the image's host is named without it)."""
    domain = repository.partition("/")[0]
    if not domain:
        return UNKNOWN
    return imageref.ImageRef(domain, "x").host.lower()


def host_of_repositories(repositories: Iterable[str]) -> str:
    """The host of the first repository that names one (``UNKNOWN`` if none does)."""
    for repo in repositories:
        host = host_of_repository(str(repo))
        if host != UNKNOWN:
            return host
    return UNKNOWN


def host_of_image(image: str) -> str:
    """An image reference as a pod names it -> its registry host (``busybox``: docker.io)."""
    try:
        return imageref.parse(image).host.lower()
    except imageref.InvalidReference:
        return UNKNOWN


class RegistryLabels:
    """Hosts to label values, capped at ``cap`` distinct hosts (then ``other``)."""

    def __init__(self, cap: int = MAX_REGISTRIES) -> None:
        self.cap = cap
        self._hosts: set[str] = set()

    def __call__(self, host: str) -> str:
        if host in self._hosts:
            return host
        if len(self._hosts) >= self.cap:
            return OTHER
        self._hosts.add(host)
        return host


def registry_of(pull: Mapping[str, Any]) -> str:
    """The registry host of a node view's pull (its repositories', else its images')."""
    host = host_of_repositories(pull.get("repositories") or ())
    if host != UNKNOWN:
        return host
    for image in pull.get("images") or ():
        return host_of_image(str(image))
    return UNKNOWN
