"""Do the nodes pulling from one registry host share one link? And what each of them
should be told about the others (issue 37 item 3).

The leader polls every node's view; per registry host it sums each node's pull rates
on it. Whether those nodes share one link (one egress, one registry limit) or each has
its own is measured, never assumed: at each change of the set of nodes pulling from
the host (one starts or ends), the summed rate of the nodes that pulled throughout is
compared over ``WINDOW`` s before and after (``SKIP`` s of the change left out: rates
move over a poll or two). If the continuing nodes gave up (at a start) or took over (at
an end) at least half the changing node's rate, the link is one (``conserve >= 0.5``).
Two changes within one judgement say nothing clear and are dropped; until a first
judgement the host is unknown and nothing is told (no guess without data).

Nodes that start pulling from the host together (within one poll: two kubelets told to
pull at once) leave no node pulling throughout. Their start is judged against the
host's rate measured earlier while a single node pulled from it (over ``WINDOW`` s, once
that node's rate no longer reaches back before it was alone): on links of their own
the set would get the sum of each node's own alone rate (the host's where a node has
none), on one link the best rate seen alone; the share of that difference the set
did not get is the ``conserve`` (the same measure as at a join). Without an earlier
single-node rate (a host first pulled from by several nodes at once) the start says
nothing from the rates alone; while they pull, their bytes per agent tick are compared
(``linkcov``): one link when those move against each other, the sum keeping its pace.

While a host is one link and more than one node pulls from it, each of them is told
the others' pulls (bytes left, rates) and the link's total; once a single node is left,
the total alone for ``REMEMBER`` s (its own rate catches up with the freed share only
over its next steps). Pure: the caller gives the samples and the times.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aggapi.apiserver.collections import linkcov
from aggapi.linkpeers import PeerLink, PeerPull
from aggapi.registrylabels import UNKNOWN, registry_of

log = logging.getLogger(__name__)

WINDOW = 4.0  # seconds of rates on each side of a change
SKIP = 1.0  # seconds after a change left out
REMEMBER = 60.0  # seconds the link's total is told after the last peer ended
FORGET = 600.0  # seconds a host's judgement outlives its last pull (links rarely change)
SHARED = 0.5  # conserve at or above: one link
MAX_SAMPLES = 200  # per host (polls come every second or so)


def _num(x: object) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else 0.0


def pulls_by_host(views: Mapping[str, Mapping[str, Any] | None],
                  ages: Mapping[str, float] | None = None
                  ) -> dict[str, dict[str, list[PeerPull]]]:
    """host -> node -> its pulls there (bytes left, rate now), from the node views;
    ``ages``: seconds since each view was read (its bytes left counted down since)."""
    out: dict[str, dict[str, list[PeerPull]]] = {}
    for node, view in views.items():
        age = max((ages or {}).get(node, 0.0), 0.0)
        pulls = [(host, p) for p in (view or {}).get("pulls") or () if isinstance(p, Mapping)
                 and (host := registry_of(p)) != UNKNOWN]  # resolving: no host to share yet
        # Before its layers have stepped twice a pull has no rate of its own; a node
        # pulling from one host then takes its link, as its agent measured it.
        link = _num((view or {}).get("linkBytesPerSecond"))
        alike = len({h for h, _ in pulls}) == 1 and not any(
            _num(p.get("bytesPerSecond")) > 0 for _, p in pulls)
        for host, p in pulls:
            left = max(_num(p.get("total")) - _num(p.get("progress")), 0.0)
            rate, eta = max(_num(p.get("bytesPerSecond")), 0.0), p.get("etaSeconds")
            if alike and link > 0:
                rate = link / len(pulls)
            if rate > 0 and isinstance(eta, (int, float)) and not isinstance(eta, bool):
                # Its agent's plan, bytes in flight since its last step included (the
                # progress moves in containerd's 1 MiB steps: 8 s at 133 kB/s).
                left = min(left, rate * max(float(eta), 0.0))
            left = max(left - rate * age, 0.0)
            out.setdefault(host, {}).setdefault(node, []).append(PeerPull(left, rate))
    return out


def measured(view: Mapping[str, Any] | None, pulls: list[PeerPull], hosts: int) -> float:
    """A node's rate on one host, for the judgement: the link rate its agent measured
    (the bytes containerd received) when the node pulls from that host alone, else its
    pulls' rates there. Never the pulls' rates alone when it can be helped: once told
    its peers, an agent splits the whole link among them, so those would say what the
    leader told it, not what the link did."""
    link = _num((view or {}).get("linkBytesPerSecond"))
    return link if hosts == 1 and link > 0 else sum(p.rate for p in pulls)


@dataclass
class _Change:
    at: float
    node: str  # the node that started or ended pulling from the host
    joined: bool
    stay: frozenset[str]  # the nodes pulling throughout


@dataclass
class _Start:
    at: float
    nodes: frozenset[str]  # the nodes that started together


@dataclass
class HostLink:
    """One registry host's judgement, across samples."""

    conserve: float | None = None  # None: not measured yet
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    change: _Change | None = None
    start: _Start | None = None
    alone: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (rate, at)
    alone_since: tuple[str, float] | None = None  # the node pulling alone now, since
    since: dict[str, float] = field(default_factory=dict)  # each node pulling now, since
    total: float | None = None  # the link's rate while more than one node pulled
    total_at: float = 0.0
    seen: float = 0.0  # last sample with a node pulling

    @property
    def shared(self) -> bool | None:
        return None if self.conserve is None else self.conserve >= SHARED

    def add(self, now: float, rates: Mapping[str, float]) -> None:
        """One sample: each node pulling from the host, with its rate (``measured``)."""
        last = self.samples[-1][1] if self.samples else {}
        if set(rates) != set(last):  # (a host's first sample: from no node)
            joined, left = set(rates) - set(last), set(last) - set(rates)
            stay = frozenset(set(rates) & set(last))
            self.start = None
            # Nodes that started pulling within a judgement's time have no rate of
            # their own yet to compare (their first bytes, or none yet): whoever joins
            # them started together with them.
            young = all(now - self.since[n] < SKIP + WINDOW for n in stay)
            if joined and not left and young and len(rates) > 1:
                self.change = None
                self.start = _Start(now, frozenset(rates))
            elif len(joined) + len(left) == 1 and stay and self.change is None:
                node = next(iter(joined or left))
                self.change = _Change(now, node, bool(joined), stay)
            else:
                self.change = None  # two at once, or one still being judged
        self.since = {n: self.since.get(n, now) for n in rates}
        self.samples.append((now, dict(rates)))
        self._alone(now, rates)
        while self.samples and (now - self.samples[0][0] > 2 * WINDOW + SKIP + 1.0
                                or len(self.samples) > MAX_SAMPLES):
            self.samples.pop(0)
        if rates:
            self.seen = now
        if len(rates) > 1 and all(v > 0 for v in rates.values()):  # every node measured
            self.total, self.total_at = sum(rates.values()), now
        self._judge(now)

    def _alone(self, now: float, rates: Mapping[str, float]) -> None:
        """Keep the rate of a node pulling alone from the host, once the window it is
        measured over lies within its time alone (the mean of such samples)."""
        if len(rates) != 1:
            self.alone_since = None
            return
        node, rate = next(iter(rates.items()))
        if self.alone_since is None or self.alone_since[0] != node:
            self.alone_since = (node, now)
        since = self.alone_since[1]
        if now < since + SKIP + WINDOW or rate <= 0:
            return
        inside = [r[node] for t, r in self.samples
                  if t >= since + SKIP + WINDOW and set(r) == {node} and r[node] > 0]
        self.alone[node] = (sum(inside) / len(inside), now)
        for n, (_, at) in list(self.alone.items()):
            if now - at > FORGET:
                del self.alone[n]

    def _judge_start(self, now: float) -> None:
        s = self.start
        if s is None or now < s.at + SKIP + WINDOW:
            return
        self.start = None
        after = [r for t, r in self.samples if s.at + SKIP <= t <= s.at + SKIP + WINDOW]
        if not after or any(set(r) != s.nodes for r in after):
            return  # the set moved again within the window
        # Samples where a node has no rate yet (its first second of bytes) would read
        # the set's sum low, that is toward one link: left out.
        after = [r for r in after if all(v > 0 for v in r.values())]
        if len(after) < 2:
            log.info("link not judged at the start of %s together: too few samples with "
                     "every node's rate", ",".join(sorted(s.nodes)))
            return
        got = sum(sum(r.values()) for r in after) / len(after)
        known = [rate for rate, at in self.alone.values() if now - at <= FORGET]
        names = ",".join(sorted(s.nodes))
        if not known:
            log.info("link not judged at the start of %s together: no rate of one node "
                     "alone from the host yet (got %.0f B/s)", names, got)
            return
        one = max(known)
        apart = sum(self.alone[n][0] if n in self.alone else one for n in s.nodes)
        if apart <= one:
            return
        self.conserve = min(max((apart - got) / (apart - one), 0.0), 1.0)
        log.info("link judged at the start of %s together: %.0f B/s against %.0f alone, "
                 "%.0f on links of their own: conserve %.2f (%s)", names, got, one, apart,
                 self.conserve, "one link" if self.shared else "links of their own")

    def _judge(self, now: float) -> None:
        self._judge_start(now)
        c = self.change
        if c is None or now < c.at + SKIP + WINDOW:
            return
        self.change = None
        before = [r for t, r in self.samples if c.at - WINDOW <= t < c.at]
        after = [r for t, r in self.samples if c.at + SKIP <= t <= c.at + SKIP + WINDOW]
        was, now_in = (set(), {c.node}) if c.joined else ({c.node}, set())
        if not before or not after or any(
                set(r) != c.stay | was for r in before) or any(
                set(r) != c.stay | now_in for r in after):
            return  # the set moved again within the windows

        def mean(rs: list[dict[str, float]], nodes: frozenset[str]) -> float:
            return sum(sum(r.get(n, 0.0) for n in nodes) for r in rs) / len(rs)
        s0, s1 = mean(before, c.stay), mean(after, c.stay)
        if c.joined:
            moved, by = s0 - s1, mean(after, frozenset({c.node}))
        else:
            moved, by = s1 - s0, mean(before, frozenset({c.node}))
        if by > 0:
            self.conserve = min(max(moved / by, 0.0), 1.0)
            log.info("link judged at %s of %s: %.0f B/s of %.0f moved: conserve %.2f (%s)",
                     "start" if c.joined else "end", c.node, moved, by, self.conserve,
                     "one link" if self.shared else "links of their own")


class LinkShare:
    """Every registry host's judgement; ``observe`` gives what to tell each node."""

    def __init__(self) -> None:
        self.hosts: dict[str, HostLink] = {}

    def observe(self, now: float, views: Mapping[str, Mapping[str, Any] | None],
                ages: Mapping[str, float] | None = None) -> dict[str, PeerLink]:
        by_host = pulls_by_host(views, ages)
        hosts_of: dict[str, int] = {}
        for nodes in by_host.values():
            for n in nodes:
                hosts_of[n] = hosts_of.get(n, 0) + 1
        for host in set(self.hosts) | set(by_host):
            nodes = by_host.get(host, {})
            hl = self.hosts.setdefault(host, HostLink())
            hl.add(now, {n: measured(views.get(n), ps, hosts_of[n]) for n, ps in nodes.items()})
            if hl.conserve is None and len(nodes) > 1 and all(hosts_of[n] == 1 for n in nodes):
                self._while_pulling(host, hl, {n: linkcov.series_of(views.get(n)) for n in nodes})
            if not nodes and now - hl.seen > FORGET:
                del self.hosts[host]  # forgotten: judged again when pulled from again
        told: dict[str, PeerLink] = {}
        for host, nodes in by_host.items():
            hl = self.hosts[host]
            if not hl.shared:
                continue
            if len(nodes) > 1:
                for n in nodes:
                    if n in told:
                        continue  # pulls from two shared hosts: one link can be told
                    told[n] = PeerLink({m: tuple(ps) for m, ps in nodes.items() if m != n},
                                       hl.total)
            elif hl.total is not None and now - hl.total_at <= REMEMBER:
                n = next(iter(nodes))
                told.setdefault(n, PeerLink({}, hl.total))
        return told

    @staticmethod
    def _while_pulling(host: str, hl: HostLink, series: dict[str, linkcov.Series]) -> None:
        """A host not judged yet, pulled from by several nodes (each from it alone, so
        each node's received bytes are this host's): one link if their bytes per tick
        move against each other (``linkcov``). Nodes that started together leave no
        other measure until one of them ends."""
        one, r = linkcov.one_link(series)
        if one:
            hl.conserve = 1.0
            log.info("link judged while %s pull from %s: their bytes per tick move against "
                     "each other, R %.3f (one link)", ",".join(sorted(series)), host, r)
