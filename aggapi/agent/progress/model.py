"""The progress engine's state: per layer, per image, per in-flight pull on the node.

Numbers are bytes; ``None`` means "not known" (never a guess, and never a number a
client could add up: KEP-5334's sum(progress)/sum(total) skips nulls). Aggregates sum
only the layers that need downloading (every phase except AlreadyPresent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from aggapi.agent.progress.rate import Rates

WAITING = "Waiting"
RESOLVING = "Resolving"
DOWNLOADING = "Downloading"
EXTRACTING = "Extracting"
DONE = "Done"
ALREADY_PRESENT = "AlreadyPresent"
FAILED = "Failed"
UNKNOWN = "Unknown"
PHASES = (WAITING, RESOLVING, DOWNLOADING, EXTRACTING, DONE, ALREADY_PRESENT, FAILED, UNKNOWN)
# The order a pull moves through; Failed may follow any of them.
PHASE_ORDER = {WAITING: 0, RESOLVING: 1, DOWNLOADING: 2, EXTRACTING: 3, DONE: 4,
               ALREADY_PRESENT: 4, FAILED: 5, UNKNOWN: -1}
TERMINAL = frozenset({DONE, ALREADY_PRESENT})


@dataclass(frozen=True)
class LayerState:
    digest: str
    phase: str
    progress: int
    total: int
    bytes_per_second: float | None = None
    eta_seconds: float | None = None
    # A present layer's: when its committed snapshot was made (containerd's clock).
    present_since: float | None = None


@dataclass(frozen=True)
class ImageState:
    ref: str  # normalized reference (containerd's image-record name)
    phase: str
    layers: tuple[LayerState, ...] = ()
    progress: int | None = None
    total: int | None = None
    bytes_per_second: float | None = None
    eta_seconds: float | None = None
    error: str = ""
    root_digest: str = ""
    lease: str = ""  # the containerd lease of the pull that brings it, if any


@dataclass(frozen=True)
class PullState:
    """One in-flight pull on the node, as containerd shows it (one lease)."""

    lease: str
    started_at: float  # epoch seconds
    phase: str
    repositories: tuple[str, ...] = ()  # "host/repo" from distribution-source labels
    images: tuple[str, ...] = ()  # watched refs attributed to it
    root_digest: str = ""
    progress: int | None = None
    total: int | None = None
    bytes_per_second: float | None = None
    downloading_layers: int = 0
    eta_seconds: float | None = None  # until its last layer's last byte (its layers' plan)


@dataclass(frozen=True)
class NodeState:
    """What one poll saw. ``time`` is excluded from equality so an unchanged node
    does not wake subscribers."""

    backend: str  # "containerd" | "cri"
    images: dict[str, ImageState] = field(default_factory=dict)
    pulls: tuple[PullState, ...] | None = None  # None: the backend cannot see pulls
    error: str = ""  # the runtime could not be read
    time: float = field(default=0.0, compare=False)
    # The node's byte counters as of this poll (rates of any set of layers, e.g. a
    # pod's), and the rate of every layer byte the node downloads: its link.
    rates: Rates | None = field(default=None, compare=False)
    link_bytes_per_second: float | None = field(default=None, compare=False)
    # Each running layer's share of the link now (bytes per second), by digest.
    shares: Mapping[str, float] | None = field(default=None, compare=False)
    # The most the node's pulls take of the link now: its link, or with other nodes'
    # pulls on it told (linktiming), the whole link less their shares. None: its link.
    room: float | None = field(default=None, compare=False)


def aggregate(layers: tuple[LayerState, ...]) -> tuple[int | None, int | None]:
    """(Σprogress, Σtotal) over layers that need downloading; (None, None) if unknown."""
    need = [la for la in layers if la.phase != ALREADY_PRESENT]
    if any(la.total < 0 for la in need):
        return None, None
    return sum(la.progress for la in need), sum(la.total for la in need)
