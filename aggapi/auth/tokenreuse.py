"""Reusable capability tokens, signed once per node and handed out again.

The leader reads the view of every node with a pull under way about once a second
(``aggapi.apiserver.collections.nodepolls``); signing a token per read was a tenth of
its event loop at 5,000 nodes. A reusable token (``CapabilitySigner.sign(reuse=True)``)
is bound exactly as a single-use one (node, subject, operation, the same lifetime) and
names no pod, container, path or parameter; this cache hands it out while at least
half its life is left, so a request made with it still reaches the agent valid.
"""

from __future__ import annotations

from dataclasses import dataclass

from aggapi.auth.capability import CapabilitySigner


@dataclass
class Reused:
    """One reusable token and how many calls it served (``served``: the agent took it)."""

    token: str
    until: float  # the signer's clock: hand it out before this
    served: int = 0


class ReusedTokens:
    """A reusable token per (node, subject, operation), signed again once half its life
    is gone. Entries past their time are swept at most once per token lifetime."""

    def __init__(self, signer: CapabilitySigner) -> None:
        self.signer = signer
        self._tokens: dict[tuple[str, str, str], Reused] = {}
        self._swept = 0.0
        self.signed = 0  # tokens signed (for tests and benchmarks)

    def __len__(self) -> int:
        return len(self._tokens)

    def get(self, *, node: str, subject: str, operation: str) -> Reused:
        now = self.signer.now()
        key = (node, subject, operation)
        got = self._tokens.get(key)
        if got is not None and now < got.until:
            return got
        if now - self._swept >= self.signer.ttl:
            self._swept = now
            self._tokens = {k: v for k, v in self._tokens.items() if now < v.until}
        # iat is the whole second (the signer's int()): half the life from there.
        got = Reused(self.signer.sign(node=node, subject=subject, operation=operation,
                                      reuse=True),
                     until=int(now) + self.signer.ttl / 2)
        self.signed += 1
        self._tokens[key] = got
        return got

    def forget(self, node: str, subject: str, operation: str) -> None:
        """Sign a new one next time (this one was refused)."""
        self._tokens.pop((node, subject, operation), None)
