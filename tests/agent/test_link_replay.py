"""The two-node scenarios as the cluster recorded them (both rounds of
``bench_progress_accuracy --cluster``; tests/agent/traces/cluster/NAME.json: the bench
throttle's record of every layer's bytes): 2nodes-400k-uneven (s39) and 2nodes-400k
(s40), replayed through both nodes' progress engines and the leader's link judgement,
and scored as the bench scores (benchmarks._accuracy_score): each node's containerd
shows its layers in 1 MiB steps dated when the step's byte left the throttle, and the
bytes it received; the agents poll every 0.25 s at the phases their objects came at;
the leader reads the views and sends its word once a second, the host judged one link
when its log said (round 1, 5.9 s and 7.8 s after the first byte) or from the start
(round 2). Issue 37's goals at 50%: median <= 10%, p90 <= 15%; at 25%, p90 <= 30%;
image and pod rates within 15%."""

from __future__ import annotations

import bisect
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.agent.progress.view import objects
from aggapi.apiserver.collections.linkshare import HostLink, LinkShare
from aggapi.auth.capability import ContainerRef
from benchmarks._accuracy_score import bytes_at, checks_for, merge_logs, steps_for, summarize
from tests.agent.fakectd import FakeContainerd, make_image
from tests.agent.fleetrun import view_of
from tests.agent.linkrun import T0, MiB

# Not in traces/ itself: its *.json are single-node pulls, replayed by other tests.
TRACES = Path(__file__).parent / "traces" / "cluster"
HOST = "127.0.0.1:5000"
POLL, LEADER = 0.25, 1.0
LAG = 0.05  # an agent's object to the bench's receipt (the dump: ~50 ms)
Log = list[tuple[float, float]]


def _step_time(log: Log, n: float) -> float:
    """When the byte log reached ``n`` bytes."""
    i = bisect.bisect_left([b for _, b in log], n)
    return log[min(i, len(log) - 1)][0]


class _Node:
    def __init__(self, name: str, layers: list[Log], phase: float) -> None:
        self.name, self.logs, self.phase = name, layers, phase
        self.fake = FakeContainerd(now=T0)
        self.img = make_image(f"{HOST}/{name}:1", [int(lg[-1][1]) for lg in layers], name)
        self.lease = f"L-{name}"
        self.fake.start_pull(self.img, self.lease)
        self.fake.fetch_manifest(self.img, self.lease)
        self.be = ContainerdBackend(self.fake, Platform("linux", "amd64"),
                                    clock=lambda: self.fake.now,
                                    monotonic=lambda: self.fake.now, received=self.received)
        self.committed: set[str] = set()
        self.objs: dict[str, list[tuple[float, dict[str, Any]]]] = {
            "layer": [], "image": [], "pod": []}
        self.view: dict[str, Any] | None = None

    def received(self) -> int:
        return int(sum(bytes_at(lg, self.fake.now - T0) for lg in self.logs))

    async def poll(self, t: float) -> None:
        """containerd as the throttle's record makes it at ``t``, then the agent's poll."""
        fake = self.fake
        fake.now = T0 + t
        for (digest, size), lg in zip(self.img.layers, self.logs, strict=True):
            if bytes_at(lg, t) >= size:
                if digest not in self.committed:
                    self.committed.add(digest)
                    fake.now = T0 + lg[-1][0]
                    fake.commit(digest, size, self.lease)
                    fake.now = T0 + t
            elif t >= lg[0][0] - 0.1:
                off = int(bytes_at(lg, t) // MiB) * MiB
                fake.download(digest, off, size, self.lease,
                              updated_at=T0 + (_step_time(lg, off) if off else lg[0][0] - 0.05),
                              started_at=T0 + lg[0][0] - 0.05)
        if len(self.committed) == len(self.logs) and self.lease in fake.leases:
            fake.finish(self.img, self.lease)
        state = await self.be.observe([self.img.name])
        self.view = view_of(state)
        c = [ContainerRef("c", self.img.name)]
        for g, out in self.objs.items():
            out += [(t + LAG, o) for o in objects(c, state, g)]

    def rows(self, flows: list[Log]) -> list[dict[str, Any]]:
        """Scored as the bench scores: ``flows``, every layer on the link (the rate's
        reference does not straddle one's start or end)."""
        rows = []
        first = next(i for i, lg in enumerate(flows) if lg is self.logs[0])
        for i, ((digest, _), lg) in enumerate(zip(self.img.layers, self.logs, strict=True)):
            mine = [(t, o) for t, o in self.objs["layer"] if o.get("layer") == digest]
            rows += [c.row() for c in checks_for("layer", digest, lg, mine,
                                                 steps_for(flows, {first + i}))]
        whole = merge_logs(self.logs)
        steps = steps_for(flows, set(range(first, first + len(self.logs))))
        for g in ("image", "pod"):
            rows += [c.row() for c in checks_for(g, self.name, whole, self.objs[g], steps)]
        return rows


async def replay_nodes(rnd: dict[str, Any], busy: float = 0.0) -> list[_Node]:
    """``busy``: seconds each poll takes between its instant (containerd read, the plan's
    time) and its view; a leader's word sent meanwhile lands inside the poll."""
    nodes = [_Node(f"n{i + 1}", [[(float(t), float(n)) for t, n in lg] for lg in n["layers"]],
                   float(n["poll_phase"])) for i, n in enumerate(rnd["nodes"])]
    judged = rnd["judged"] if rnd["judged"] is not None and rnd["judged"] > 0 else -1.0
    end = max(lg[-1][0] for n in nodes for lg in n.logs) + 0.5
    events: list[tuple[float, int, int]] = []
    for k, n in enumerate(nodes):  # (a poll's place in time: when its view is there)
        events += [(-1.0 + n.phase + i * POLL + busy, 0, k)
                   for i in range(int((end + 1) / POLL))]
    round_phase = judged % LEADER
    events += [(-2.0 + round_phase + i * LEADER + d, kind, 0)
               for i in range(int(end + 2)) for d, kind in ((-0.1, 1), (0.0, 2))]
    share = LinkShare()
    read_at: dict[str, float] = {}
    for t, kind, k in sorted(events):
        if kind == 0:
            await nodes[k].poll(t - busy)
        elif kind == 1:
            read_at = {n.name: t for n in nodes if n.view is not None}
        else:
            if t >= judged:  # the leader's judgement, when its log said
                share.hosts.setdefault("127.0.0.1", HostLink()).conserve = 1.0
            views = {n.name: n.view for n in nodes if n.name in read_at}
            told = share.observe(T0 + t, views, {n: t - at for n, at in read_at.items()})
            for n in nodes:
                if n.name in told:
                    n.fake.now = T0 + t
                    n.be.tell_peers(told[n.name])
    return nodes


async def replay(rnd: dict[str, Any], busy: float = 0.0) -> list[dict[str, Any]]:
    """The round's rows, scored as the bench scores."""
    nodes = await replay_nodes(rnd, busy)
    flows = [lg for n in nodes for lg in n.logs]
    return [r for n in nodes for r in n.rows(flows)]


ROUNDS = [pytest.param(name, index, id=f"{name}-round{index + 1}")
          for name in ("2nodes-400k-uneven", "2nodes-400k") for index in (0, 1)]


async def _rows(name: str, index: int) -> list[dict[str, Any]]:
    return await replay(json.loads((TRACES / f"{name}.json").read_text())["rounds"][index])


@pytest.mark.parametrize(("name", "index"), ROUNDS)
async def test_the_recorded_cluster_rounds_meet_the_goals(name: str, index: int) -> None:
    """On the code the uneven rounds ran on, node 1's 8 MiB layer at half its bytes said
    12.4 s with 10.5 s (round 2: 10.7 s) left: node 2's pull had ended since its last
    1 MiB step, and its bytes in flight were still counted at the third of the link it
    had. Rates against the true rate on T's side of a flow's end (the bench's reference
    since stop 41; the centred one read the uneven rounds' step as 14.5% and 23%)."""
    rows = await _rows(name, index)
    s = summarize(rows, 0.0)
    half = sorted(r["eta_error"] for r in rows if r["fraction"] == 0.5)
    assert s["eta_error_median"] <= 0.10, half
    assert s["eta_error_p90"] <= 0.15, half
    assert s["eta_error_p90_at_25"] <= 0.30, rows
    assert all(r["said_eta"] is not None for r in rows if r["fraction"] == 0.5), rows
    assert s["rate_error_max"] <= 0.15, [(r["item"], r["fraction"], r["said_rate"],
                                          r["real_rate"]) for r in rows if r["kind"] != "layer"]


def _jumps(node: _Node) -> int:
    """Polls whose image's end (time + ETA) lies more than 2 s off the median of the 8
    polls around it, after the first 8 s (round 1's judgement came at 5.9 and 7.8 s)."""
    ends = [(t, t + o["etaSeconds"]) for t, o in node.objs["image"]
            if o.get("etaSeconds") is not None]
    out = 0
    for i, (t, end) in enumerate(ends):
        near = [e for _, e in ends[max(0, i - 4):i] + ends[i + 1:i + 5]]
        out += len(near) >= 4 and t > 8.0 and abs(end - statistics.median(near)) > 2.0
    return out


@pytest.mark.parametrize("busy", [0.1, 0.2])
@pytest.mark.parametrize("index", [0, 1], ids=["round1", "round2"])
async def test_a_word_that_lands_while_a_poll_runs_is_used(index: int, busy: float) -> None:
    """The uneven rounds with each poll taking ``busy`` s from its instant to its view, as
    under load (s41's cluster run at load 4.8: 0.07-0.33 s): a leader's word that lands
    meanwhile is newer than the poll's instant. Until stop 42 the poll then had no word
    at all and planned as if the node had no peer (that run's node 1 at 50%: 23.2 s said,
    15.8 s left, 286 kB/s with 397 kB/s real); replayed here, round 1's 25% p90 read 39.7%
    and its rate 11.4% (5.7% and 6.1% as the word is used)."""
    rnd = json.loads((TRACES / "2nodes-400k-uneven.json").read_text())["rounds"][index]
    nodes = await replay_nodes(rnd, busy)
    # A poll without the word says the node's end as if it had no peer: its ETA jumps
    # off its neighbours' (round 1, node 1: 16 such polls at 0.1 s before, none quiet).
    quiet = await replay_nodes(rnd)
    assert all(_jumps(n) <= _jumps(q) for n, q in zip(nodes, quiet, strict=True)), (
        [_jumps(n) for n in nodes], [_jumps(q) for q in quiet])
    flows = [lg for n in nodes for lg in n.logs]
    rows = [r for n in nodes for r in n.rows(flows)]
    s = summarize(rows, 0.0)
    assert s["eta_error_median"] <= 0.10, rows
    assert s["eta_error_p90"] <= 0.15, rows
    assert s["eta_error_p90_at_25"] <= 0.30, [(r["item"], r["said_eta"], r["eta_error"])
                                              for r in rows if r["fraction"] == 0.25]
    assert all(r["said_eta"] is not None for r in rows if r["fraction"] == 0.5), rows
    assert s["rate_error_max"] <= 0.15, [(r["item"], r["fraction"], r["said_rate"],
                                          r["real_rate"]) for r in rows if r["kind"] != "layer"]


@pytest.mark.parametrize("index", [0, 1], ids=["round1", "round2"])
async def test_an_even_pair_of_nodes_each_gets_half_the_link_after_their_siblings_end(
        index: int) -> None:
    """2nodes-400k: each node's 4 MiB layer ends at ~42 s, its 8 MiB one then runs alone
    at half the link (200 kB/s). On s40's code each image said 151-161 kB/s at 75% of
    its bytes: its layer's weight on the link was its rate over whole 1 MiB steps (100 kB/s
    before the sibling's end, caught up only steps later) against the peer's told share,
    and each node's share fed the other's (the fixed point of 400k x 100/(100 + r))."""
    rows = await _rows("2nodes-400k", index)
    rates = [(r["item"], r["fraction"], r["said_rate"], r["real_rate"], r["rate_error"])
             for r in rows if r["kind"] in ("image", "pod")]
    assert summarize(rows, 0.0)["rate_error_max"] <= 0.15, rates
