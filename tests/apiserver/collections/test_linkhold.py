"""--link-peers: the leader holds the node collection (and so its link feeder) while it
leads, and lets go when it no longer does or when a new term makes new feeds."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from aggapi.apiserver.collections.linkhold import LinkHold


class _Nodes:
    def __init__(self) -> None:
        self.held = 0

    def acquire(self, key: str) -> None:
        self.held += 1

    def release(self, key: str) -> None:
        self.held -= 1


def _hold(enabled: bool = True) -> tuple[LinkHold, Any, Any]:
    feeds, election = SimpleNamespace(nodes=_Nodes()), SimpleNamespace(is_leader=True)
    return LinkHold(cast(Any, feeds), cast(Any, election), enabled=enabled), feeds, election


def test_held_while_leading_once() -> None:
    hold, feeds, election = _hold()
    hold.check()
    hold.check()
    assert feeds.nodes.held == 1
    election.is_leader = False
    hold.check()
    assert feeds.nodes.held == 0


def test_a_new_term_moves_the_hold() -> None:
    hold, feeds, _ = _hold()
    hold.check()
    old, feeds.nodes = feeds.nodes, _Nodes()
    hold.check()
    assert (old.held, feeds.nodes.held) == (0, 1)


def test_not_held_without_the_flag() -> None:
    hold, feeds, _ = _hold(enabled=False)
    hold.check()
    assert feeds.nodes.held == 0
