"""OCI image manifests (Docker v2 ones too), as containerd stores them.

From an image's root digest to the layers this node pulls: index -> platform
manifest -> config (diff IDs -> chain IDs). Blobs are read from containerd's
content store once per digest and cached (they are immutable). Not to be
confused with the repository's manifests/ (Kubernetes YAML).
"""

from __future__ import annotations

import hashlib
import json
import platform as _platform
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aggapi.runtime.errors import RuntimeNotFound

INDEX_TYPES = frozenset({
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
})
MANIFEST_TYPES = frozenset({
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
})
MAX_MANIFEST_SIZE = 4 * 1024 * 1024  # same cap as containerd's manifest reads

_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64",
           "armv7l": "arm", "armv6l": "arm", "ppc64le": "ppc64le", "s390x": "s390x",
           "riscv64": "riscv64", "i386": "386", "i686": "386"}


class ManifestError(Exception):
    """The image cannot be pulled on this node (e.g. no manifest for its platform)."""


class BlobReader(Protocol):
    async def read_content(self, digest: str, offset: int = 0, size: int = 0) -> bytes: ...


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str = ""

    @classmethod
    def parse(cls, spec: str) -> Platform:
        parts = spec.strip().split("/")
        if len(parts) not in (2, 3) or not all(parts):
            raise ValueError(f"platform must be os/arch[/variant], got {spec!r}")
        return cls(*parts)

    @classmethod
    def host(cls) -> Platform:
        machine = _platform.machine().lower()
        arch = _GOARCH.get(machine, machine)
        variant = {"armv7l": "v7", "armv6l": "v6"}.get(machine, "")
        return cls("linux", arch, variant)

    def _norm_variant(self, arch: str, variant: str) -> str:
        # containerd treats arm64 "" and "v8" alike, and ignores variants on amd64.
        if arch == "arm64" and variant in ("", "v8"):
            return "v8"
        if arch == "amd64":
            return ""
        return variant

    def matches(self, p: Mapping[str, Any]) -> bool:
        arch = str(p.get("architecture", ""))
        return (str(p.get("os", "")) == self.os and arch == self.architecture
                and self._norm_variant(arch, str(p.get("variant", "")))
                == self._norm_variant(self.architecture, self.variant))

    def __str__(self) -> str:
        return "/".join(x for x in (self.os, self.architecture, self.variant) if x)


@dataclass(frozen=True)
class LayerDesc:
    digest: str
    size: int
    media_type: str
    chain_id: str = ""  # name of the committed snapshot once unpacked; "" if unknown yet


@dataclass(frozen=True)
class ResolvedImage:
    root_digest: str  # what the image record targets (index or manifest)
    manifest_digest: str  # the platform manifest
    config_digest: str
    layers: tuple[LayerDesc, ...]
    complete: bool  # False while the config (and so the chain IDs) is not known yet

    @property
    def total(self) -> int:
        return sum(layer.size for layer in self.layers)


def chain_ids(diff_ids: Sequence[str]) -> list[str]:
    """ChainID(n) = sha256(ChainID(n-1) + " " + DiffID(n)), ChainID(0) = DiffID(0)."""
    out: list[str] = []
    for d in diff_ids:
        out.append(d if not out else
                   "sha256:" + hashlib.sha256(f"{out[-1]} {d}".encode()).hexdigest())
    return out


class ManifestStore:
    """Reads and caches manifest-like blobs; resolves a root digest to its layers."""

    def __init__(self, reader: BlobReader, platform: Platform, cache_size: int = 1024) -> None:
        self.reader = reader
        self.platform = platform
        self.cache_size = cache_size
        self._blobs: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def blob_json(self, digest: str) -> dict[str, Any] | None:
        """The parsed blob, or None if it is not (yet) in the content store."""
        hit = self._blobs.get(digest)
        if hit is not None:
            self._blobs.move_to_end(digest)
            return hit
        try:
            raw = await self.reader.read_content(digest, 0, MAX_MANIFEST_SIZE)
        except RuntimeNotFound:
            return None
        if hashlib.sha256(raw).hexdigest() != digest.removeprefix("sha256:"):
            return None  # truncated (over the cap) or not sha256: not a manifest we read
        try:
            doc = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError):
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        self._blobs[digest] = doc
        while len(self._blobs) > self.cache_size:
            self._blobs.popitem(last=False)
        return doc

    @staticmethod
    def kind(doc: Mapping[str, Any]) -> str:
        mt = str(doc.get("mediaType", ""))
        if mt in INDEX_TYPES or (not mt and "manifests" in doc):
            return "index"
        if mt in MANIFEST_TYPES or (not mt and "layers" in doc and "config" in doc):
            return "manifest"
        return ""

    def pick(self, index: Mapping[str, Any]) -> str:
        """The digest of the index entry for this node's platform."""
        for m in index.get("manifests") or ():
            if str(m.get("mediaType", "")) in INDEX_TYPES | MANIFEST_TYPES or "mediaType" not in m:
                plat = m.get("platform")
                if plat is None or self.platform.matches(plat):
                    return str(m["digest"])
        raise ManifestError(f"no match for platform {self.platform} in manifest list")

    async def resolve(self, root_digest: str) -> ResolvedImage | None:
        """Layers of ``root_digest`` for this platform; None while a needed manifest is
        not committed yet. Raises ManifestError when the image has no such platform."""
        doc = await self.blob_json(root_digest)
        if doc is None:
            return None
        manifest_digest = root_digest
        depth = 0
        while self.kind(doc) == "index":
            depth += 1
            if depth > 4:
                raise ManifestError("manifest lists nested too deep")
            manifest_digest = self.pick(doc)
            child = await self.blob_json(manifest_digest)
            if child is None:
                return None
            doc = child
        if self.kind(doc) != "manifest":
            raise ManifestError(f"{manifest_digest} is not an image manifest")
        config_digest = str((doc.get("config") or {}).get("digest", ""))
        raw_layers = [(str(x["digest"]), int(x.get("size", 0)), str(x.get("mediaType", "")))
                      for x in doc.get("layers") or ()]
        config = await self.blob_json(config_digest) if config_digest else None
        diff_ids = list(((config or {}).get("rootfs") or {}).get("diff_ids") or ())
        chains = chain_ids(diff_ids) if len(diff_ids) == len(raw_layers) else []
        layers = tuple(
            LayerDesc(d, size, mt, chains[i] if chains else "")
            for i, (d, size, mt) in enumerate(raw_layers)
        )
        return ResolvedImage(root_digest, manifest_digest, config_digest, layers,
                             complete=bool(chains) or not raw_layers)
