"""Nodes that start pulling from one registry host together (within a poll or two, as
two kubelets told at once): no node pulled throughout, so no change can be judged. The
leader judges their start against the host's rate when one node pulled alone earlier
(issue 37 item 3)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from aggapi.apiserver.collections.linkshare import LinkShare
from tests.apiserver.test_linkshare import REG, _views


def _series(ls: LinkShare, t0: float, t1: float, rates: Mapping[str, float],
            step: float = 0.5) -> None:
    t = t0
    while t < t1:
        ls.observe(t, _views(rates))
        t += step


def _alone_then_together(together: Mapping[str, float], alone: float = 4e5) -> LinkShare:
    """a pulls alone 0-12 s at ``alone``; nothing until 30 s; then a and b together."""
    ls = LinkShare()
    _series(ls, 0.0, 12.0, {"a": alone})
    _series(ls, 12.0, 30.0, {})
    _series(ls, 30.0, 40.0, together)
    return ls


def test_a_start_together_that_takes_no_more_than_one_node_alone_is_one_link() -> None:
    ls = _alone_then_together({"a": 2.4e5, "b": 1.6e5})
    assert ls.hosts[REG].shared is True
    told = ls.observe(40.0, _views({"a": 2.4e5, "b": 1.6e5}))
    assert set(told) == {"a", "b"} and told["a"].total == pytest.approx(4e5)


def test_a_start_together_that_takes_each_node_its_own_rate_is_links_of_their_own() -> None:
    ls = _alone_then_together({"a": 4e5, "b": 3.6e5})
    assert ls.hosts[REG].shared is False
    assert ls.observe(40.0, _views({"a": 4e5, "b": 3.6e5})) == {}


def test_without_a_rate_alone_a_start_together_says_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    """A host first pulled from by two nodes at once: no guess, and the log says why."""
    ls = LinkShare()
    with caplog.at_level(logging.INFO, logger="aggapi.apiserver.collections.linkshare"):
        _series(ls, 0.0, 20.0, {"a": 2e5, "b": 2e5})
    assert ls.hosts[REG].conserve is None
    assert "no rate of one node alone" in caplog.text


def test_the_total_is_taken_only_once_every_node_has_a_rate() -> None:
    """At a start the nodes' first samples have no rate: no total of 0 is told."""
    ls = _alone_then_together({"a": 0.0, "b": 0.0})
    assert ls.hosts[REG].total is None


def test_a_node_seen_one_poll_before_the_other_started_with_it() -> None:
    """a's pull shows one poll before b's, with no bytes yet: b's arrival is no join to
    judge (a's rate before it was nothing, not a link given up), but one start."""
    ls = LinkShare()
    _series(ls, 0.0, 12.0, {"a": 4e5})
    _series(ls, 12.0, 30.0, {})
    ls.observe(30.0, _views({"a": 0.0}))
    _series(ls, 30.5, 40.0, {"a": 2e5, "b": 2e5})
    assert ls.hosts[REG].shared is True


def test_the_rate_alone_is_taken_once_its_window_lies_in_the_time_alone() -> None:
    """After b's end, a's measured rate lags (its window reaches back into the shared
    time): only samples whose window lies wholly after b's end count."""
    ls = LinkShare()
    _series(ls, 0.0, 5.0, {"a": 2e5, "b": 2e5})
    _series(ls, 5.0, 10.0, {"a": 2e5})  # lagging: still the shared share
    _series(ls, 10.0, 14.0, {"a": 4e5})
    assert ls.hosts[REG].alone["a"][0] == pytest.approx(4e5)


def test_a_node_with_no_rate_yet_does_not_pull_the_sum_toward_one_link() -> None:
    """Links of their own, b's rate unknown for its first 4 s: counted as 0, the set's
    mean over the window (0.53 MB/s) would read two thirds of the way to one link."""
    ls = LinkShare()
    _series(ls, 0.0, 12.0, {"a": 4e5})
    _series(ls, 12.0, 30.0, {})
    _series(ls, 30.0, 34.0, {"a": 4e5, "b": 0.0})
    _series(ls, 34.0, 40.0, {"a": 4e5, "b": 4e5})
    assert ls.hosts[REG].shared is False
