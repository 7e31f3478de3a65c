"""Degraded progress for runtimes without a content store we can read (CRI-O & co.).

CRI tells only whether an image is present (ImageStatus), so images are Done,
AlreadyPresent or Unknown, with progress and total -1: no invented numbers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from aggapi import imageref
from aggapi.agent.progress.model import (
    ALREADY_PRESENT,
    DONE,
    FAILED,
    UNKNOWN,
    ImageState,
    NodeState,
)
from aggapi.runtime.cri import ImageInfo


class ImageStatusLike(Protocol):
    async def image_status(self, image: str) -> ImageInfo | None: ...


class CRIBackend:
    name = "cri"

    def __init__(self, cri: ImageStatusLike, *, clock: Callable[[], float] = time.time) -> None:
        self.cri = cri
        self._clock = clock
        self._present_at_start: dict[str, bool] = {}

    def forget(self) -> None:
        self._present_at_start.clear()

    async def present_images(self) -> tuple[str, ...] | None:
        """Not listed (CRI would tell by ImageStatus, one image at a time): unknown."""
        return None

    async def observe(self, watched: Iterable[str]) -> NodeState:
        refs = sorted(set(watched))
        valid = []
        images: dict[str, ImageState] = {}
        for ref in refs:
            try:
                valid.append((ref, imageref.normalize(ref)))
            except imageref.InvalidReference:
                images[ref] = ImageState(ref, FAILED, error=f"invalid image reference {ref!r}")
        found = await asyncio.gather(*(self.cri.image_status(name) for _, name in valid))
        for (ref, _), info in zip(valid, found, strict=True):
            first = self._present_at_start.setdefault(ref, info is not None)
            if info is None:
                images[ref] = ImageState(ref, UNKNOWN)
            else:
                images[ref] = ImageState(ref, ALREADY_PRESENT if first else DONE)
        self._present_at_start = {r: v for r, v in self._present_at_start.items() if r in refs}
        return NodeState("cri", images, None, time=self._clock())
