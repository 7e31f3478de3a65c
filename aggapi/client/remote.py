"""What a copy names and reports, both ways: the remote path, the result, and the
progress and pacing hooks (the kubectl plugin's bar, ``--limit-rate``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from aggapi.client.connection import subresource_path


class Progress(Protocol):
    def start(self, total: int | None, done: int = 0) -> None: ...

    def advance(self, n: int) -> None: ...


class RateLimit:
    """Pace a transfer to ``rate`` bytes/s (curl's --limit-rate), by sleeping."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.t0 = time.monotonic()
        self.sent = 0

    async def pace(self, n: int) -> None:
        if not self.rate:
            return
        self.sent += n
        ahead = self.sent / self.rate - (time.monotonic() - self.t0)
        if ahead > 0:
            await asyncio.sleep(ahead)


class NoProgress:
    def start(self, total: int | None, done: int = 0) -> None:
        pass

    def advance(self, n: int) -> None:
        pass


@dataclass(frozen=True)
class RemotePath:
    """``[namespace/]pod:/path`` in container ``container`` (None: the pod's only one)."""

    namespace: str
    pod: str
    path: str
    container: str | None = None

    def source(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container or ''}:{self.path}"

    def url(self) -> str:
        return subresource_path(self.namespace, self.pod, "copy", watch=True)

    def params(self, **extra: str) -> list[tuple[str, str]]:
        out = [("path", self.path)]
        if self.container:
            out.insert(0, ("container", self.container))
        return out + list(extra.items())


@dataclass
class Result:
    path: str
    kind: str  # file, dir or symlink
    size: int = 0
    sha256: str = ""
    resumed_from: int = 0
    retries: int = 0
    entries: int = 0
    skipped: list[Any] = field(default_factory=list)  # entries the server left out
    refused: list[str] = field(default_factory=list)  # entries not created here, and why
    verified: bool = True  # a directory's files each checked against their sha256

