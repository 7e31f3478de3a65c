"""Copy limits (KEP-4582 ContainerCopySizeLimit, ContainerCopiesPerPod) and slots.

A copy over the per-pod, per-namespace or node-wide count is refused at once with 429
and Retry-After (KEP-4582: better than waiting an unbounded time); a body over the
size limit is a 413. One namespace may hold only its share of the node's slots
(--copy-namespace-share), so a tenant that parks copies cannot lock the others out.
Slots are plain counters: all access is on the event loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from aggapi.agent.copy import workers
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
    # --copy-namespace-share: the fraction of the node's copy slots (and of its copy
    # worker threads) one namespace may hold; 1: no per-namespace limit
    namespace_share: float = 0.5
    # --copy-min-rate / --copy-rate-window: a copy whose client moves fewer than
    # min_rate bytes/s, over rate_window s of waiting for it, is aborted
    # (aggapi.agent.copy.pace); 0: no minimum
    min_rate: int = 1024
    rate_window: float = 30.0

    def namespace_slots(self) -> int:
        return share_of(self.copies_per_node, self.namespace_share)


def share_of(total: int, share: float) -> int:
    """A fraction of ``total``, at least one (a namespace alone on a node still copies)."""
    return max(1, min(total, int(total * share)))


class CopySlots:
    """Counts copies running per pod, per namespace and on the node."""

    def __init__(self, limits: CopyLimits) -> None:
        self.limits = limits
        self.per_pod: dict[str, int] = {}
        self.per_namespace: dict[str, int] = {}
        self.total = 0

    def _refuse(self, what: str) -> StatusError:
        return StatusError(429, f"too many copies running {what}; retry later",
                           retry_after=self.limits.retry_after)

    @contextmanager
    def slot(self, pod_uid: str, namespace: str = "") -> Iterator[None]:
        """One copy's slot; while held, the copy's worker calls are queued as this
        namespace's (aggapi.agent.copy.workers: a fair share of the threads too)."""
        lim = self.limits
        if self.per_pod.get(pod_uid, 0) >= lim.copies_per_pod:
            raise self._refuse(f"in this pod (limit {lim.copies_per_pod})")
        share = lim.namespace_slots()
        if self.per_namespace.get(namespace, 0) >= share:
            raise self._refuse(f"in namespace {namespace!r} on this node (limit {share} of "
                               f"the node's {lim.copies_per_node})")
        if self.total >= lim.copies_per_node:
            raise self._refuse(f"on this node (limit {lim.copies_per_node})")
        _add(self.per_pod, pod_uid, 1)
        _add(self.per_namespace, namespace, 1)
        self.total += 1
        token = workers.TENANT.set(namespace)
        try:
            yield
        finally:
            workers.TENANT.reset(token)
            self.total -= 1
            _add(self.per_pod, pod_uid, -1)
            _add(self.per_namespace, namespace, -1)

    def check_size(self, size: int) -> None:
        if size > self.limits.size_limit:
            raise StatusError(413, f"copy of {size} bytes exceeds the size limit of "
                              f"{self.limits.size_limit} bytes")


def _add(counts: dict[str, int], key: str, n: int) -> None:
    left = counts.get(key, 0) + n
    if left:
        counts[key] = left
    else:
        del counts[key]
