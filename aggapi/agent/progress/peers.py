"""The latest word from the leader on this node's link peers (aggapi.linkpeers), kept
only ``ttl`` seconds (three of the leader's poll intervals): stale peers would hold back
a share that is no longer taken.

A poll plans at the instant it began, after awaiting containerd: a word that came
meanwhile is newer than that instant, and is used as of it (the freshest word there
is; a poll under load takes 0.1-0.3 s, so one word in several used to land inside one,
and that poll planned as if the node had no peer: s41's uneven miss). Only a word from
more than ``ttl`` ahead is not trusted (a clock that stepped back).

It also keeps when peers' pulls ended (``ends``): on one link a peer's end hands its
share to this node's layers at once, while their rates, measured over whole 1 MiB
steps, show it only steps later. The planner counts a layer's bytes in flight since
then at its new share, as it does after a sibling's end on this node (``Rates.in_flight``).
"""

from __future__ import annotations

import math
from collections import deque

from aggapi.linkpeers import TTL, PeerLink, PeerPull

MAX_ENDS = 16  # peer pulls' ends kept (only those since a layer's last steps count)


class PeerBook:
    """The latest PeerLink, while fresh, and when peers' pulls ended."""

    def __init__(self, ttl: float = TTL) -> None:
        self.ttl = ttl
        self._link: PeerLink | None = None
        self.at = 0.0  # when the latest word came
        self._ends: deque[float] = deque(maxlen=MAX_ENDS)

    def fresh(self, now: float) -> bool:
        """The latest word is ``ttl`` old at most at ``now`` (or came after ``now``)."""
        return self._link is not None and -self.ttl <= now - self.at <= self.ttl

    def put(self, link: PeerLink, now: float) -> None:
        if self._link is not None and self.fresh(now):
            self._ended(self._link, self.at, link, now)
        self._link, self.at = link, now

    def _ended(self, old: PeerLink, at: float, new: PeerLink, now: float) -> None:
        """Pulls running in the word of ``at`` that ``new`` no longer counts: per peer,
        as many as it has fewer running pulls, those due first. Each ended when its bytes
        left ran out at its rate, within [at, now] (the views are a poll old: the
        countdown is the best date there is)."""
        for node, pulls in old.peers.items():
            due = sorted(_due(at, p) for p in pulls if p.remaining > 0)
            still = sum(1 for p in new.peers.get(node, ()) if p.remaining > 0)
            for end in due[:max(len(due) - still, 0)]:
                self._ends.append(min(max(end, at), now))

    def ends(self, now: float) -> tuple[float, ...]:
        """When peers' pulls ended, up to ``now``: those the latest word no longer
        counts, and those of the latest (fresh) word whose bytes left ran out since.
        A word that came after ``now`` is used (``current``): the ends it told of are
        too, as of ``now`` at the latest."""
        link = self._link
        fresh = link is not None and self.fresh(now)
        upto = max(now, self.at) if fresh else now
        out = [min(t, now) for t in self._ends if t <= upto]
        if link is not None and fresh:
            out += [end for pulls in link.peers.values() for p in pulls
                    if p.remaining > 0 and (end := _due(self.at, p)) <= now]
        return tuple(sorted(out))

    def current(self, now: float) -> PeerLink | None:
        """The latest word while fresh, its pulls' bytes left counted down at their
        rates since it came (the agent plans from now); one that came after ``now``, as
        it is."""
        link, age = self._link, now - self.at
        if link is None or not self.fresh(now):
            return None
        if age <= 0:
            return link
        return PeerLink({n: tuple(PeerPull(max(p.remaining - p.rate * age, 0.0), p.rate)
                                  for p in ps) for n, ps in link.peers.items()}, link.total)


def _due(at: float, p: PeerPull) -> float:
    """When a pull told at ``at`` runs out of bytes at its rate (never, without one)."""
    return at + p.remaining / p.rate if p.rate > 0 else math.inf
