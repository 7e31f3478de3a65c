"""Kubelet's image-pull limits (KEP-3673) from the node's kubelet config file.

``serializeImagePulls`` defaults to true; ``maxParallelImagePulls`` is unset
(None) by default and only meaningful when pulls are not serialized.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import yaml

DEFAULT_PATH = "/var/lib/kubelet/config.yaml"


@dataclass(frozen=True)
class PullLimits:
    serialize_image_pulls: bool = True
    max_parallel_image_pulls: int | None = None
    source: str = ""
    error: str = ""  # why the file could not be used (defaults are reported then)

    @property
    def parallel_slots(self) -> int | None:
        """How many pulls kubelet runs at once; None = unlimited."""
        if self.serialize_image_pulls:
            return 1
        return self.max_parallel_image_pulls or None

    def to_json(self) -> dict[str, Any]:
        return {"serializeImagePulls": self.serialize_image_pulls,
                "maxParallelImagePulls": self.max_parallel_image_pulls,
                "parallelSlots": self.parallel_slots, "source": self.source,
                "error": self.error}


def parse(text: str, source: str = "") -> PullLimits:
    """Parse a KubeletConfiguration in YAML or JSON (JSON is YAML, but try it first:
    it is exact and faster)."""
    try:
        doc: Any = json.loads(text)
    except ValueError:
        doc = yaml.safe_load(text)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ValueError("kubelet config is not a mapping")
    serialize = doc.get("serializeImagePulls", True)
    if not isinstance(serialize, bool):
        raise ValueError("serializeImagePulls must be a boolean")
    mp = doc.get("maxParallelImagePulls")
    if mp is not None and (isinstance(mp, bool) or not isinstance(mp, int) or mp < 1):
        raise ValueError("maxParallelImagePulls must be a positive integer")
    return PullLimits(serialize, mp, source)


class KubeletConfigReader:
    """Reads the file again only when its mtime or size changed."""

    def __init__(self, path: str = DEFAULT_PATH) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._limits = PullLimits(source=path, error="not read yet")

    def _read(self) -> PullLimits:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return self._limits
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
            self._limits = parse(text, self.path)
            self._stamp = stamp
        except (OSError, ValueError, yaml.YAMLError) as err:
            self._stamp = None
            self._limits = PullLimits(source=self.path, error=f"{type(err).__name__}: {err}")
        return self._limits

    async def limits(self) -> PullLimits:
        return await asyncio.to_thread(self._read)
