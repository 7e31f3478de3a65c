"""Image references normalized the way containerd's CRI plugin names image records.

``busybox`` -> ``docker.io/library/busybox:latest``; a reference with both tag and
digest keeps only the digest (as containerd's ``reference/docker.ParseDockerRef``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

DEFAULT_DOMAIN = "docker.io"
LEGACY_DOMAIN = "index.docker.io"
OFFICIAL_PREFIX = "library/"
DEFAULT_TAG = "latest"
# Distinct references remembered by ``parse``: a cluster's pods name a few images many
# times over, and building 50,000 pods' objects parsed each reference four times (a
# quarter of the build's CPU, cProfile). Above the images a rollout reads by turns (the
# replay's 5,400 pods pulling at once, each its own image: a cycle longer than the bound
# never hits). Bounded (about 0.4 KiB each): any reference may come from a pod.
PARSE_CACHE = 8192

_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$")
_SHA256 = re.compile(r"^sha256:[a-f0-9]{64}$")
_DOMAIN = re.compile(r"^(?:[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?$")


class InvalidReference(ValueError):
    pass


@dataclass(frozen=True)
class ImageRef:
    domain: str  # registry host, with port if any
    path: str  # repository path inside the registry
    tag: str = ""  # empty when digest is set
    digest: str = ""

    @property
    def name(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def host(self) -> str:
        """Host without port: the key containerd uses in distribution.source labels."""
        if self.domain.startswith("["):
            return self.domain.split("]")[0] + "]"
        return self.domain.rsplit(":", 1)[0] if ":" in self.domain else self.domain

    def __str__(self) -> str:
        if self.digest:
            return f"{self.name}@{self.digest}"
        return f"{self.name}:{self.tag}"


@functools.lru_cache(maxsize=PARSE_CACHE)
def parse(ref: str) -> ImageRef:
    """Parse and normalize ``ref``; raise InvalidReference if it is not one. The
    result is immutable, so one parse per distinct reference is shared (invalid ones
    are parsed again: lru_cache keeps no exception)."""
    if not ref or ref != ref.strip():
        raise InvalidReference(f"invalid reference {ref!r}")
    rest, digest = ref, ""
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise InvalidReference(f"invalid digest in {ref!r}")
        if digest.startswith("sha256:") and not _SHA256.match(digest):
            raise InvalidReference(f"invalid sha256 digest in {ref!r}")
    tag = ""
    # A ':' after the last '/' is a tag separator; before it, a port.
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1:]
        if not _TAG.match(tag):
            raise InvalidReference(f"invalid tag in {ref!r}")
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        domain, path = first, remainder
        if not _DOMAIN.match(domain):
            raise InvalidReference(f"invalid registry host in {ref!r}")
    else:
        domain, path = DEFAULT_DOMAIN, rest
    if domain == LEGACY_DOMAIN:
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = OFFICIAL_PREFIX + path
    if not path or not all(_COMPONENT.match(c) for c in path.split("/")):
        raise InvalidReference(f"invalid repository name in {ref!r}")
    if len(domain) + 1 + len(path) > 255:
        raise InvalidReference(f"repository name too long in {ref!r}")
    if digest:
        return ImageRef(domain, path, "", digest)
    return ImageRef(domain, path, tag or DEFAULT_TAG, "")


def normalize(ref: str) -> str:
    """The image-record name containerd gives ``ref``."""
    return str(parse(ref))


def identity(ref: str) -> tuple[str, str] | None:
    """The image-record name containerd gives ``ref`` and its repository as the
    distribution-source labels name it (host without port), or None for no reference:
    how a node's pulls and present images name one image."""
    try:
        r = parse(ref)
    except InvalidReference:
        return None
    return str(r), f"{r.host}/{r.path}"
