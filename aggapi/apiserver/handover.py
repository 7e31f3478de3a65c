"""The hand-over's marks on the collections' Lease (``election.py`` runs it): a leader
shutting down asks for a successor (its identity under HANDOVER), the first follower
able to names itself (SUCCESSOR) and, once its next term is warm (``Succession``),
says so (SUCCESSOR_READY); then the leader hands it the Lease. All three go when the
Lease changes hands. Only the replicas' ServiceAccount may write the Lease.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

HANDOVER = "aggapi.io/handover"
SUCCESSOR = "aggapi.io/successor"
SUCCESSOR_READY = "aggapi.io/successor-ready"
HANDOVER_KEYS = (HANDOVER, SUCCESSOR, SUCCESSOR_READY)
# Seconds between reads of the Lease while a hand-over runs (every replica: the
# successor takes the Lease, the others follow it, within this of its being handed).
HANDOVER_POLL = 0.2


@dataclass(frozen=True)
class Succession:
    """How a follower warms to succeed a leader that hands over (parts.py wires the
    feeds' warm term and the mirror)."""
    able: Callable[[], bool]  # it can: its mirror holds the leader's state
    warm: Callable[[], Coroutine[Any, Any, None]]  # until its next term is warm
    cool: Callable[[], Awaitable[None]]  # drop what warmed: another replica leads


def notes(lease: Mapping[str, Any]) -> dict[str, str]:
    """The Lease's annotations."""
    return dict((lease.get("metadata") or {}).get("annotations") or {})


def annotated(lease: Mapping[str, Any], extra: Mapping[str, str],
              drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """``lease`` (as read: its resourceVersion makes a write of it optimistic) with
    ``extra`` annotations and without ``drop``."""
    meta = dict(lease.get("metadata") or {})
    kept = {k: v for k, v in notes(lease).items() if k not in drop}
    meta["annotations"] = {**kept, **extra}
    return {**lease, "metadata": meta}
