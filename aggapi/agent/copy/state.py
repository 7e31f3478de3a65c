"""Everything the copy handlers share: limits, slots, workers, the container resolver
and the digest cache. Built once by aggapi.agent.copy.engine.new_state and handed to the
handlers (aggapi.agent.copy.handlers.CopyHandlers) at construction."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from aggapi.agent.copy.digests import DigestCache, lower_priority
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits, CopySlots
from aggapi.agent.copy.workers import Workers

HASH_THREADS = 2


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
    # Whole-file hashes of more than a chunk (a HEAD's, a GET's digest up front): their
    # own threads at the lowest priority, one per namespace at a time, so a long hash
    # leaves both the copy workers and the CPU to other tenants (digests.lower_priority).
    hashers: Workers = field(default_factory=lambda: Workers(
        HASH_THREADS, share=1 / HASH_THREADS, initializer=lower_priority))
    slots: CopySlots = field(init=False)
    # The engine's retry of start-up cleanup, while records remain (engine.startup).
    cleanup_task: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.slots = CopySlots(self.limits)
