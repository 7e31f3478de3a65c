"""The leader's judgement of whether the nodes pulling from one registry host share one
link, over series of node views, and what each node is told (issue 37 item 3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from aggapi.apiserver.collections.linkshare import REMEMBER, LinkShare, pulls_by_host
from aggapi.linkpeers import PeerLink, PeerPull, parse, unparse

REG, OTHER = "reg.example", "other.example"


def _pull(rate: float, left: float = 1e6, host: str = REG) -> dict[str, Any]:
    return {"repositories": [f"{host}/app"], "images": [f"{host}/app:1"],
            "progress": 1000, "total": 1000 + left, "bytesPerSecond": rate}


def _views(rates: Mapping[str, float], host: str = REG) -> dict[str, Any]:
    return {n: {"pulls": [_pull(r, host=host)]} for n, r in rates.items()}


def _run(shared: bool, link: float = 4e5, until: float = 30.0, step: float = 0.5
         ) -> tuple[LinkShare, list[tuple[float, dict[str, PeerLink]]]]:
    """Node a pulls throughout; b pulls from 5 s to 15 s, at 0.8 of a's weight. On one
    link they split ``link``; on their own links a keeps its rate and b gets its own."""
    ls, told = LinkShare(), []
    t = 0.0
    while t < until:
        rates = {"a": link}
        if 5.0 <= t < 15.0:
            rates = ({"a": link * 1.2 / 2, "b": link * 0.8 / 2} if shared
                     else {"a": link, "b": link * 0.8})
        told.append((t, ls.observe(t, _views(rates))))
        t += step
    return ls, told


def test_a_shared_link_is_judged_one_and_each_node_told_its_peers() -> None:
    ls, told = _run(shared=True)
    assert ls.hosts[REG].shared is True
    assert all(not out for t, out in told if t < 5.0 + 1.0 + 4.0)  # unknown until judged
    at12 = dict(told)[12.0]
    assert at12["a"] == PeerLink({"b": (PeerPull(1e6, 1.6e5),)}, 4e5)
    assert at12["b"] == PeerLink({"a": (PeerPull(1e6, 2.4e5),)}, 4e5)
    # b done: a alone is told the link's total (its own rate lags the freed share).
    assert dict(told)[16.0] == {"a": PeerLink({}, 4e5)}


def test_links_of_their_own_are_judged_apart_and_nothing_told() -> None:
    ls, told = _run(shared=False)
    assert ls.hosts[REG].shared is False
    assert all(not out for _, out in told)


def test_the_total_is_told_no_longer_than_remembered() -> None:
    _, told = _run(shared=True, until=15.0 + REMEMBER + 5.0)
    last = [t for t, out in told if out]
    assert 15.0 + REMEMBER - 1.0 <= max(last) <= 15.0 + REMEMBER + 0.5


def test_two_changes_in_one_window_judge_nothing() -> None:
    """b and c start one second apart: which gave what is not clear."""
    ls = LinkShare()
    for i in range(40):
        t = i * 0.5
        rates = {"a": 4e5}
        if t >= 5.0:
            rates = {"a": 2e5, "b": 2e5}
        if t >= 6.0:
            rates = {"a": 4e5 / 3, "b": 4e5 / 3, "c": 4e5 / 3}
        assert ls.observe(t, _views(rates)) == {}
    assert ls.hosts[REG].conserve is None


def test_hosts_are_judged_apart() -> None:
    """b pulls from another host: a's link on REG never changes set; nothing judged."""
    ls = LinkShare()
    for i in range(40):
        t = i * 0.5
        views = _views({"a": 4e5})
        if 5.0 <= t < 15.0:
            views["b"] = {"pulls": [_pull(2e5, host=OTHER)]}
        ls.observe(t, views)
    assert ls.hosts[REG].conserve is None and ls.hosts[OTHER].conserve is None


def test_pulls_by_host_skips_unresolved_and_garbage() -> None:
    views: dict[str, Any] = {
        "a": {"pulls": [{"repositories": [], "images": [], "progress": 0, "total": None,
                         "bytesPerSecond": None}, "x", _pull(3.0, left=5.0)]},
        "b": None, "c": {"pulls": None}}
    assert pulls_by_host(views) == {REG: {"a": [PeerPull(5.0, 3.0)]}}


@given(st.lists(st.dictionaries(st.sampled_from("abcd"), st.floats(0, 1e6)), max_size=40))
def test_what_is_told_is_what_an_agent_takes(series: list[dict[str, float]]) -> None:
    ls = LinkShare()
    for i, rates in enumerate(series):
        for node, link in ls.observe(i * 0.5, _views(rates)).items():
            assert node in rates
            assert parse(unparse(link)) == link


def test_the_judgement_takes_the_measured_link_over_the_pulls_rates() -> None:
    """An agent told its peers splits the whole link among them in its pulls' rates:
    were those judged, the leader's word would confirm itself. The link rate the agent
    measured (containerd's received bytes) says what the link did: here, separate."""
    ls = LinkShare()
    for i in range(40):
        t = i * 0.5
        split = 5.0 <= t < 15.0
        views = {"a": {"pulls": [_pull(2e5 if split else 4e5)], "linkBytesPerSecond": 4e5}}
        if split:
            views["b"] = {"pulls": [_pull(2e5)], "linkBytesPerSecond": 3e5}
        ls.observe(t, views)
    assert ls.hosts[REG].shared is False


def test_a_pulls_bytes_left_count_its_bytes_in_flight_by_its_eta() -> None:
    """Its progress lags by the bytes since its last 1 MiB step; its agent's ETA does
    not: bytes left = rate x ETA when that is fewer (never more than total - progress)."""
    fresh = {**_pull(1e5, left=1e6), "etaSeconds": 4.0}
    late = {**_pull(1e5, left=1e6), "etaSeconds": 40.0}
    unknown = {**_pull(1e5, left=1e6), "etaSeconds": None}
    by = pulls_by_host({"a": {"pulls": [fresh, late, unknown]}})
    assert by == {REG: {"a": [PeerPull(4e5, 1e5), PeerPull(1e6, 1e5), PeerPull(1e6, 1e5)]}}


def test_a_views_bytes_left_are_counted_down_by_its_age() -> None:
    """A view read 1.5 s before the round: its pull has had 1.5 s at its rate since."""
    by = pulls_by_host({"a": {"pulls": [_pull(1e5, left=1e6)]},
                        "b": {"pulls": [_pull(1e5, left=1e5)]}}, {"a": 1.5, "b": 3.0})
    assert by == {REG: {"a": [PeerPull(8.5e5, 1e5)], "b": [PeerPull(0.0, 1e5)]}}


def test_pulls_with_no_rate_yet_take_their_nodes_measured_link() -> None:
    """Before its layers have stepped twice a pull has no rate; its node's measured link
    stands in (split among its pulls on the host), and not for a node on two hosts."""
    one = {"pulls": [_pull(0.0, left=1e6), _pull(0.0, left=2e6)], "linkBytesPerSecond": 3e5}
    two = {"pulls": [_pull(0.0, left=1e6), _pull(0.0, left=2e6, host=OTHER)],
           "linkBytesPerSecond": 3e5}
    assert pulls_by_host({"a": one})[REG]["a"] == [PeerPull(1e6, 1.5e5), PeerPull(2e6, 1.5e5)]
    assert pulls_by_host({"a": two})[REG]["a"] == [PeerPull(1e6, 0.0)]
