"""Other nodes' pulls on one registry link: the word the apiserver's leader sends an
agent (``PUT /v1/linkpeers``), its wire form on both sides.

When several nodes pull from one registry host over one link (judged at the leader,
aggapi.apiserver.collections.linkshare), none of them sees the others' bytes. The leader
sends each such node its peers' pulls (bytes left, rate now) and the link's total rate
(``unparse``); the agent parses it once, bounded in peers, pulls and numbers (``parse``),
keeps it a few seconds (aggapi.agent.progress.peers) and plans the peers' pulls as flows
on the one link (aggapi.agent.progress.linktiming).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_PEERS = 64  # nodes on one link
MAX_PULLS = 32  # pulls per peer node
MAX_NAME = 253  # a node name (DNS subdomain)
MAX_BYTES = float(1 << 50)  # bytes left in one pull
MAX_RATE = 1e11  # bytes per second (100 GB/s)
TTL = 3.0  # seconds: three of the leader's poll intervals (1 s)


class BadPeers(ValueError):
    """The input is not a peer set (the route answers 400 with the reason)."""


@dataclass(frozen=True)
class PeerPull:
    remaining: float  # bytes still to come
    rate: float  # bytes per second it gets now


@dataclass(frozen=True)
class PeerLink:
    """The link as the leader last saw it: the other nodes' pulls on it, and its total
    rate (every node's bytes on it; None: not known)."""

    peers: Mapping[str, tuple[PeerPull, ...]]
    total: float | None


def _number(x: object, top: float, what: str) -> float:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise BadPeers(f"{what} must be a number")
    v = float(x)
    if not math.isfinite(v) or v < 0 or v > top:
        raise BadPeers(f"{what} must be between 0 and {top:g}")
    return v


def parse(body: object) -> PeerLink:
    """``{"peers": {node: [{"remaining": n, "bytesPerSecond": r}, ...]}, "total": r}``,
    every part checked; anything else raises BadPeers."""
    if not isinstance(body, dict) or set(body) - {"peers", "total"}:
        raise BadPeers("expected an object with peers and total")
    raw = body.get("peers", {})
    if not isinstance(raw, dict):
        raise BadPeers("peers must be an object")
    if len(raw) > MAX_PEERS:
        raise BadPeers(f"at most {MAX_PEERS} peers")
    peers: dict[str, tuple[PeerPull, ...]] = {}
    for node, pulls in raw.items():
        if not isinstance(node, str) or not 0 < len(node) <= MAX_NAME:
            raise BadPeers("a peer must be a node name")
        if not isinstance(pulls, list) or len(pulls) > MAX_PULLS:
            raise BadPeers(f"a peer's pulls must be a list of at most {MAX_PULLS}")
        out: list[PeerPull] = []
        for p in pulls:
            if not isinstance(p, dict) or set(p) != {"remaining", "bytesPerSecond"}:
                raise BadPeers("a pull is {remaining, bytesPerSecond}")
            out.append(PeerPull(_number(p["remaining"], MAX_BYTES, "remaining"),
                                _number(p["bytesPerSecond"], MAX_RATE, "bytesPerSecond")))
        peers[node] = tuple(out)
    total = body.get("total")
    return PeerLink(peers, None if total is None else _number(total, MAX_RATE, "total"))


def unparse(link: PeerLink) -> dict[str, Any]:
    """The body ``parse`` reads (the leader's side)."""
    return {"peers": {n: [{"remaining": p.remaining, "bytesPerSecond": p.rate} for p in ps]
                      for n, ps in link.peers.items()},
            "total": link.total}
