"""Which phase each layer of an image is in, from one poll of containerd.

A layer is Downloading while an ingest ``layer-<digest>`` exists, Extracting
while an active ``extract-<id> <chainID>`` snapshot exists (for a layer this pull
fetched), and present once the committed snapshot ``<chainID>`` exists: Done if
created after the pull began, otherwise AlreadyPresent. An agent that did not watch
a finished pull knows its start only when the apiserver vouches for it (kubelet's
Pulled event): ``with_pulls_began``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from aggapi.agent.progress.leases import LeaseView
from aggapi.agent.progress.model import (
    ALREADY_PRESENT,
    DONE,
    DOWNLOADING,
    EXTRACTING,
    WAITING,
    ImageState,
    LayerState,
    NodeState,
    aggregate,
)
from aggapi.agent.progress.ocimanifest import ResolvedImage
from aggapi.agent.progress.rate import Rates
from aggapi.runtime.containerd import IngestStatus, SnapshotInfo

EXTRACT_PREFIX = "extract-"


@dataclass
class Snapshots:
    """The layer snapshots of one poll."""

    committed: dict[str, float]  # chainID -> created_at
    extracting: frozenset[str]  # chainIDs being unpacked


def snapshots_of(snaps: Sequence[SnapshotInfo]) -> Snapshots:
    """Committed layers by chain ID, and the chain IDs being unpacked."""
    committed: dict[str, float] = {}
    extracting: set[str] = set()
    for s in snaps:
        if s.kind == "committed":
            committed[s.name] = s.created_at
        elif s.kind == "active" and s.name.startswith(EXTRACT_PREFIX):
            _, _, chain = s.name.partition(" ")
            if chain:
                extracting.add(chain)
    return Snapshots(committed, frozenset(extracting))


def layer_states(resolved: ResolvedImage, view: LeaseView | None,
                 high_water: dict[str, int] | None, ingests: Mapping[str, IngestStatus],
                 snaps: Snapshots, created: Mapping[str, float], rates: Rates,
                 since_wall: float | None) -> tuple[LayerState, ...]:
    """Each layer's phase and bytes, and a downloading layer's own rate (its share of
    the link and its ETA come later, from aggapi.agent.progress.eta). ``view`` is the
    lease pulling the image (None if none); ``high_water`` the highest offset seen per
    layer, updated here (None for the node view, which keeps none); ``created``
    content creation times."""
    since = view.lease.created_at if view is not None else since_wall
    out: list[LayerState] = []
    for la in resolved.layers:
        ing = ingests.get(la.digest)
        high = high_water.get(la.digest, 0) if high_water is not None else 0
        in_lease = view is not None and la.digest in view.content
        created_at = created.get(la.digest)
        # Fetched by this pull (rather than found in the content store).
        fresh = high > 0 or (in_lease and created_at is not None and view is not None
                             and created_at >= view.lease.created_at)
        if ing is not None and ing.kind == "layer":
            got = min(ing.offset, la.size)
            if high_water is not None:
                high_water[la.digest] = max(high, got)
            out.append(LayerState(la.digest, DOWNLOADING, got, la.size,
                                  rates.rate(la.digest)))
        elif la.chain_id and la.chain_id in snaps.committed:
            at = snaps.committed[la.chain_id]
            done = high > 0 or (since is not None and at >= since)
            out.append(LayerState(la.digest, DONE if done else ALREADY_PRESENT,
                                  la.size, la.size, present_since=at))
        elif in_lease and not fresh:
            out.append(LayerState(la.digest, ALREADY_PRESENT, la.size, la.size))
        elif fresh and la.chain_id and la.chain_id in snaps.extracting:
            # containerd prepares extract-* snapshots before the layer arrives:
            # only a downloaded layer is really being extracted.
            out.append(LayerState(la.digest, EXTRACTING, la.size, la.size))
        elif fresh:
            # Downloaded (or between ingest commit and the next lease refresh):
            # waiting for the layers below it to be unpacked.
            out.append(LayerState(la.digest, DOWNLOADING, la.size if in_lease else high,
                                  la.size))
        else:
            out.append(LayerState(la.digest, WAITING, 0, la.size))
    return tuple(out)


def with_pulls_began(state: NodeState, began: Mapping[str, float]) -> NodeState:
    """``state`` with each present layer of an image in ``began`` (image -> when its
    pull began, as kubelet said) whose snapshot was committed since counted as brought
    by that pull: Done, and in the image's bytes, as the stream that watched it said.
    Only for an image the agent found already there (it did not watch the pull): of a
    pull it watched, or watches now (a re-pull), its own phases stand."""
    images = dict(state.images)
    for ref, since in began.items():
        st = images.get(ref)
        if st is not None and st.phase == ALREADY_PRESENT:
            images[ref] = _began(st, since)
    return replace(state, images=images) if images != state.images else state


def _began(st: ImageState, since: float) -> ImageState:
    layers = tuple(replace(la, phase=DONE) if la.phase == ALREADY_PRESENT
                   and la.present_since is not None and la.present_since >= since else la
                   for la in st.layers)
    if layers == st.layers:
        return st
    prog, total = aggregate(layers)
    return replace(st, layers=layers, progress=prog, total=total, phase=DONE)
