"""The pure parts of benchmarks/bench_progress_accuracy.py (its _accuracy_* modules) on
synthetic byte logs and streams: where 25/50/75% of an item's bytes fall, the real rate
around a moment, the object a user saw then, and how errors and goals are scored."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks._accuracy_scenarios import SCENARIOS, pick
from benchmarks._accuracy_score import (
    ByteLog,
    MiB,
    bytes_at,
    checks_for,
    eta_error,
    latest_before,
    merge_logs,
    peak_rate,
    quantile,
    rate_error,
    real_rate,
    steps_for,
    summarize,
    time_at_fraction,
)
from benchmarks._accuracy_stacks import ClusterStack, Stack
from tests.framework.cluster import Cluster
from tests.framework.controlplane import ControlPlane
from tests.framework.node import Node


def chunk(rate: float) -> int:
    """The throttle's write size at ``rate`` (ThrottleProxy._chunk): ~1/20 s of it."""
    return min(65536, max(4096, int(rate / 20)))


def steady(t0: float, rate: float, total: int, step: int = 0) -> ByteLog:
    """What the throttle records for one blob sent at ``rate`` from ``t0``."""
    step = step or chunk(rate)
    out: ByteLog = []
    n = 0
    while n < total:
        n = min(total, n + step)
        out.append((t0 + n / rate, n))
    return out


logs_st = st.lists(st.lists(st.tuples(st.floats(0, 100), st.integers(1, 10**6)),
                            min_size=1, max_size=30), min_size=1, max_size=6)


def as_log(points: list[tuple[float, int]]) -> ByteLog:
    """Sorted times, cumulative sums of the increments."""
    out: ByteLog = []
    total = 0
    for t, d in sorted(points):
        total += d
        out.append((t, total))
    return out


@given(logs_st, st.floats(-1, 101))
def test_merged_log_is_the_sum_at_every_moment(raw: list[list[tuple[float, int]]],
                                               t: float) -> None:
    logs = [as_log(p) for p in raw]
    merged = merge_logs(logs)
    assert merged[-1][1] == sum(lg[-1][1] for lg in logs)
    assert [s for s, _ in merged] == sorted({s for s, _ in merged})
    # Exact at every sample and outside them all; between, one of the logs' first
    # samples (a step, not spread) may fall inside a spread of the merged log.
    for m in {*(s for lg in logs for s, _ in lg), t if t < merged[0][0] else -1.0,
              t if t >= merged[-1][0] else 101.0}:
        assert bytes_at(merged, m) == pytest.approx(sum(bytes_at(lg, m) for lg in logs))


@given(st.floats(0, 1000), st.floats(1e5, 1e7), st.integers(1 << 20, 200 << 20),
       st.sampled_from([0.25, 0.5, 0.75]))
def test_fraction_time_and_rate_of_a_steady_blob(t0: float, rate: float, total: int,
                                                 f: float) -> None:
    log = steady(t0, rate, total)
    t = time_at_fraction(log, f)
    assert t == pytest.approx(t0 + f * total / rate, abs=1e-6)
    real = real_rate(log, t)
    assert real is not None
    # Only the first write is counted at once (its time before the first sample unknown).
    span = min(log[-1][0], t + 2) - max(log[0][0], t - 2)
    assert abs(real - rate) <= 1.01 * chunk(rate) / max(span, 1e-9) + 1e-6 * rate


def test_real_rate_sees_a_stall_in_the_window() -> None:
    # 100 kB/s for 10 s, nothing for 10 s, then 100 kB/s again.
    log = steady(0.0, 1e5, 1_000_000, 10_000)
    log += [(t + 10.0, n + 1_000_000) for t, n in steady(10.0, 1e5, 1_000_000, 10_000)]
    assert real_rate(log, 5.0) == pytest.approx(1e5, rel=0.01)
    assert real_rate(log, 15.0) == 0.0
    assert real_rate(log, 10.0) == pytest.approx(0.5e5, rel=0.03)  # half stalled


def uneven() -> tuple[ByteLog, ByteLog]:
    """2nodes-400k-uneven's link (400 kB/s) as the throttle records it: node 2's one 3 MiB
    flow at a third until its end at 23.6 s, node 1's flows (one merged item here) at two
    thirds, then at all of it."""
    end = 3 * MiB / (4e5 / 3)
    n2 = steady(0.0, 4e5 / 3, 3 * MiB)
    n1 = steady(0.0, 8e5 / 3, 6 * MiB)
    n1 += [(t + end, n + 6 * MiB) for t, n in steady(0.0, 4e5, 6 * MiB)]
    return n1, n2


@pytest.mark.parametrize(("dt", "rate"), [(-0.36, 8e5 / 3), (0.31, 4e5), (1.9, 4e5),
                                          (-1.9, 8e5 / 3)])
def test_the_real_rate_does_not_straddle_another_pulls_end(dt: float, rate: float) -> None:
    """The reference is the true rate on T's side of a known step (a flow on the link
    ending: the throttle's record steps there from 267k to 400k), not their mix: at
    node 2's end +0.31 s the centred window read 343k with 398k flowing (s39/s40)."""
    n1, n2 = uneven()
    steps = steps_for([n1, n2], {0})
    # The flows' starts together, and node 2's last byte.
    assert steps[-1] == n2[-1][0] and all(x < 0.1 for x in steps[:-1])
    t = n2[-1][0] + dt
    assert real_rate(n1, t, steps=steps) == pytest.approx(rate, rel=0.02)
    centred = real_rate(n1, t)
    assert centred is not None and abs(centred - rate) / rate > 0.1 * (2 - abs(dt)) / 2


@given(st.lists(st.tuples(st.floats(0, 50), st.floats(1e4, 1e6), st.integers(1, 8 << 20)),
                min_size=1, max_size=5), st.data())
def test_steps_are_other_flows_ends_and_never_widen_the_window(
        spec: list[tuple[float, float, int]], data: st.DataObject) -> None:
    """An item alone on the link has no step (its own layers' ends leave it the link);
    any step is a flow's first or last byte; the window only ever narrows, and with no
    step within it the reference is the centred one."""
    flows = [steady(t0, rate, size) for t0, rate, size in spec]
    assert steps_for(flows, set(range(len(flows)))) == ()
    i = data.draw(st.integers(0, len(flows) - 1))
    steps = steps_for(flows, {i})
    assert set(steps) <= {x for lg in flows for x in (lg[0][0], lg[-1][0])}
    t = data.draw(st.floats(flows[i][0][0], flows[i][-1][0]))
    got, centred = real_rate(flows[i], t, steps=steps), real_rate(flows[i], t)
    if not any(abs(x - t) < 2.0 for x in steps):
        assert got == centred


def test_latest_before_is_strictly_before() -> None:
    objs = [(1.0, {"n": 1}), (2.0, {"n": 2}), (3.0, {"n": 3})]
    assert latest_before(objs, 0.5) is None
    assert latest_before(objs, 2.0) == {"n": 1}
    assert latest_before(objs, 2.5) == {"n": 2}
    assert latest_before(objs, 9.0) == {"n": 3}


@pytest.mark.parametrize(("eta", "remaining", "want"), [
    (10, 10.0, 0.0), (15, 10.0, 0.5), (5.0, 10.0, 0.5), (30, 10.0, 2.0),
    (None, 10.0, 1.0), (-1, 10.0, 1.0), ("3", 10.0, 1.0), (True, 10.0, 1.0)])
def test_eta_error(eta: object, remaining: float, want: float) -> None:
    assert eta_error(eta, remaining) == pytest.approx(want)


def test_peak_rate_is_the_fastest_mib() -> None:
    # 64 KiB at once at t=0, then 50 kB/s: the first MiB came faster than the rest.
    log = [(0.0, 65536.0)] + [(t / 10, 65536 + 5000.0 * t) for t in range(1, 600)]
    first = MiB / ((MiB - 65536) / 50_000)
    assert peak_rate(log) == pytest.approx(first, rel=0.01)
    assert peak_rate([(t, 50_000.0 * t) for t in range(1, 60)]) == pytest.approx(50_000, rel=0.05)


def test_rate_error() -> None:
    assert rate_error(400_000, 400_000.0) == 0.0
    assert rate_error(968_000, 350_000.0) == pytest.approx(618 / 350)  # the pod
    assert rate_error(None, 1.0) == 1.0
    assert rate_error(5, None) is None  # no real rate to compare with
    # Nothing shown yet (progress 0): no rate to measure, not scored; once it moved, it is.
    assert rate_error(None, 50_000.0, 0) is None
    assert rate_error(None, 50_000.0, 1 << 20) == 1.0


def test_quantile_nearest_rank() -> None:
    assert quantile([0.3, 0.1, 0.2], 0.5) == 0.2
    assert quantile(list(range(1, 11)), 0.9) == 9
    assert math.isnan(quantile([], 0.5))


def stream(log: ByteLog, every: float, eta_scale: float, rate: float
           ) -> list[tuple[float, dict[str, object]]]:
    """An agent reporting every ``every`` s: the true ETA times ``eta_scale``."""
    end = log[-1][0]
    t = log[0][0]
    out = []
    while t < end:
        out.append((t, {"kind": "Progress", "phase": "Downloading", "layer": "sha256:a",
                        "bytesPerSecond": rate, "etaSeconds": eta_scale * (end - t)}))
        t += every
    return out


def test_true_reports_score_near_zero_and_meet_the_goals() -> None:
    log = steady(100.0, 4e5, 20 << 20)
    rows = [c.row() for c in checks_for("image", "i", log, stream(log, 0.1, 1.0, 4e5))]
    assert [r["fraction"] for r in rows] == [0.25, 0.5, 0.75]
    assert all(r["eta_error"] < 0.01 and r["rate_error"] < 0.02 for r in rows)
    s = summarize(rows, 0.9)
    assert s["goal_met"] and s["eta_error_median"] < 0.01


def test_wrong_or_missing_reports_fail_the_goals() -> None:
    log = steady(0.0, 4e5, 20 << 20)
    late = [c.row() for c in checks_for("pod", "p", log, stream(log, 0.1, 1.4, 7e5))]
    assert all(r["eta_error"] == pytest.approx(0.4, abs=0.02) for r in late)
    s = summarize(late, 0.5)
    assert not s["goals"]["eta_median"] and not s["goals"]["eta_p90"]
    assert s["rate_error_max"] == pytest.approx(0.75, abs=0.02) and not s["goals"]["rate"]
    # No object before the moment (stream still silent): a missing ETA, error 1.0.
    silent = [c.row() for c in checks_for("layer", "L1", log, [])]
    assert all(r["eta_error"] == 1.0 and r["said_eta"] is None for r in silent)
    # A layer shown faster than the link fails that goal alone.
    fast = summarize([c.row() for c in checks_for("image", "i", log,
                                                  stream(log, 0.1, 1.0, 4e5))], 1.3)
    assert fast["goals"] == {"eta_median": True, "eta_p90": True, "rate": True,
                             "layer_rate_within_link": False}
    assert math.isnan(summarize([], 0.0)["eta_error_median"])
    assert not summarize([], 0.0)["goal_met"]


def test_scenarios_of_each_path(tmp_path: Path) -> None:
    """The host harness's defaults are its one-node scenarios (the two-node one needs
    --cluster); the cluster path runs its two-node ones by default, one pod pinned to each node,
    and only what it can: containerd 2.x, never two pods on one node (that needs a kubelet
    restart with parallel pulls)."""
    host = pick(None)
    assert host and all(s.nodes == 1 for s in host)
    assert [s.name for s in pick(None, cluster=True)] == ["2nodes-400k", "2nodes-400k-uneven"]
    assert [s.name for s in pick(["2nodes-400k", "l3-5m"])] == ["l3-5m", "2nodes-400k"]
    cp = ControlPlane(instance="e2e", state=tmp_path / "cp")
    cluster = Cluster(cp, Node(cp))
    stack = ClusterStack(cp, False, cluster=cluster)
    two = next(s for s in SCENARIOS if s.name == "2nodes-400k")
    assert two.pods == 2 and stack.cannot_run(two) is None
    assert stack.placement(two) == [(n.name, n.cri_address) for n in cluster.nodes]
    assert len({name for name, _ in stack.placement(two)}) == 2
    why = {s.name: stack.cannot_run(s) for s in SCENARIOS}
    assert why["l3-400k"] is None and why["2pods-400k"] and why["l3-400k-ctd16"]
    assert Stack(cp, False).cannot_run(two) == "needs --cluster"
    uneven = next(s for s in SCENARIOS if s.name == "2nodes-400k-uneven")
    assert [uneven.layers(k) for k in (1, 2)] == [(8, 4), (3,)]
    assert uneven.seconds == pytest.approx(15 * MiB / 400_000)
    assert [two.layers(k) for k in (1, 2)] == [(8, 4), (8, 4)]
