"""The latest word from the leader on this node's link peers (aggapi.linkpeers), kept
only ``ttl`` seconds (three of the leader's poll intervals): stale peers would hold back
a share that is no longer taken.
"""

from __future__ import annotations

from aggapi.linkpeers import TTL, PeerLink, PeerPull


class PeerBook:
    """The latest PeerLink, while fresh."""

    def __init__(self, ttl: float = TTL) -> None:
        self.ttl = ttl
        self._link: PeerLink | None = None
        self.at = 0.0  # when the latest word came

    def put(self, link: PeerLink, now: float) -> None:
        self._link, self.at = link, now

    def current(self, now: float) -> PeerLink | None:
        """The latest word while fresh, its pulls' bytes left counted down at their
        rates since it came (the agent plans from now)."""
        link, age = self._link, now - self.at
        if link is None or not 0 <= age <= self.ttl:
            return None
        if age == 0:
            return link
        return PeerLink({n: tuple(PeerPull(max(p.remaining - p.rate * age, 0.0), p.rate)
                                  for p in ps) for n, ps in link.peers.items()}, link.total)
