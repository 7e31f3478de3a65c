"""Copy limits (KEP-4582 ContainerCopySizeLimit, ContainerCopiesPerPod) and slots.

A copy over the per-pod or node-wide count is refused at once with 429 and
Retry-After (KEP-4582: better than waiting an unbounded time); a body over the
size limit is a 413. Slots are plain counters: all access is on the event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aggapi.status import StatusError

GiB = 1 << 30


@dataclass(frozen=True)
class CopyLimits:
    size_limit: int = 10 * GiB  # --copy-size-limit: bytes per copy (file or tar total)
    copies_per_pod: int = 4  # --copies-per-pod
    copies_per_node: int = 32  # --copies-per-node
    max_entries: int = 100_000  # --copy-max-entries: entries in one directory copy
    max_depth: int = 64  # --copy-max-depth: directory nesting in one copy
    state_dir: str = "/var/lib/aggapi-agent/inflight"  # --copy-state-dir
    retry_after: int = 5  # seconds suggested to a client refused with 429
    body_idle_timeout: float = 60.0  # --body-idle-timeout: a silent upload is aborted
    # --copy-direct-io-min-size: raw uploads from this size bypass the page cache
    # (aggapi.agent.copy.directio); 0: never
    direct_io_min_size: int = 4 << 20


class CopySlots:
    """Counts copies running per pod and on the node."""

    def __init__(self, limits: CopyLimits) -> None:
        self.limits = limits
        self.per_pod: dict[str, int] = {}
        self.total = 0

    def _refuse(self, what: str) -> StatusError:
        return StatusError(429, f"too many copies running {what}; retry later",
                           retry_after=self.limits.retry_after)

    @contextmanager
    def slot(self, pod_uid: str) -> Iterator[None]:
        if self.per_pod.get(pod_uid, 0) >= self.limits.copies_per_pod:
            raise self._refuse(f"in this pod (limit {self.limits.copies_per_pod})")
        if self.total >= self.limits.copies_per_node:
            raise self._refuse(f"on this node (limit {self.limits.copies_per_node})")
        self.per_pod[pod_uid] = self.per_pod.get(pod_uid, 0) + 1
        self.total += 1
        try:
            yield
        finally:
            self.total -= 1
            left = self.per_pod[pod_uid] - 1
            if left:
                self.per_pod[pod_uid] = left
            else:
                del self.per_pod[pod_uid]

    def check_size(self, size: int) -> None:
        if size > self.limits.size_limit:
            raise StatusError(413, f"copy of {size} bytes exceeds the size limit of "
                              f"{self.limits.size_limit} bytes")
