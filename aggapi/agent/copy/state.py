"""Everything the copy handlers share: limits, slots, workers, the container resolver
and the digest cache. Built once by aggapi.agent.copy.engine.new_state and handed to the
handlers (aggapi.agent.copy.handlers.CopyHandlers) at construction."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from aggapi.agent.copy.digests import DigestCache
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits, CopySlots
from aggapi.agent.copy.workers import Workers


class Resolver(Protocol):
    """Finds a running container and opens its root (see aggapi.agent.copy.container)."""

    async def resolve(self, pod_uid: str, container: str) -> FsRoot: ...

    async def by_id(self, container_id: str) -> FsRoot | None: ...


@dataclass
class CopyState:
    limits: CopyLimits
    resolver: Resolver
    workers: Workers = field(default_factory=Workers)
    digests: DigestCache = field(default_factory=DigestCache)
    slots: CopySlots = field(init=False)
    # The engine's retry of start-up cleanup, while records remain (engine.startup).
    cleanup_task: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.slots = CopySlots(self.limits)
