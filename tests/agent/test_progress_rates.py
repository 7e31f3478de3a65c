"""Rates and ETAs on a shared link: the progress engine (ContainerdBackend over the
scripted containerd of tests/agent/fakectd.py) fed the ingests of a simulated link
(tests/agent/linksim.py) where layers of one or more pulls share a token bucket
unevenly and containerd 2.x shows each layer's bytes in 1 MiB steps.

At 25, 50 and 75% of each layer's and image's bytes, what the engine reports is
compared with the truth the simulation knows: the rate of the bytes at that moment
and the time still left until the last byte.
"""

from __future__ import annotations

import json
import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.agent.linkrun import (
    KB,
    MB,
    TRACES,
    A,
    B,
    Errors,
    MiB,
    Pull,
    p90,
    run_trace,
)

# Issue 23's image (24, 12 and 4 MB) and wider ones; link rates from 50 kB/s to 5 MB/s;
# uneven shares as measured (221 vs 123 kB/s) and wider.
SCENARIOS = {
    "1 layer @50kB/s": (50 * KB, [Pull(A, [6 * MiB], [1.0])]),
    "3 layers @400kB/s (issue 23)": (400 * KB, [Pull(A, [24 * MB, 12 * MB, 4 * MB],
                                                     [221, 123, 160])]),
    "3 layers @50kB/s": (50 * KB, [Pull(A, [5 * MB, 3 * MB, 2 * MB], [3, 2, 1])]),
    "6 layers @5MB/s": (5000 * KB, [Pull(A, [90 * MB, 40 * MB, 30 * MB, 20 * MB, 10 * MB,
                                             5 * MB], [1.0, 1.8, 0.6, 1.2, 1.0, 0.7])]),
    "two pulls @400kB/s": (400 * KB, [Pull(A, [16 * MB, 8 * MB], [1.5, 1.0]),
                                      Pull(B, [10 * MB, 6 * MB, 3 * MB], [1.0, 0.8, 1.3])]),
}


def _assert_goals(e: Errors, pulls: int, exact: bool = True) -> None:
    assert not e.missing, e.missing
    # The pod's rate is the link's; an image's is its layers' shares of it now. Steps
    # dated by polls make the first figures rougher.
    assert max(e.pod_rate) <= (0.15 if exact else 0.30), e.pod_rate
    assert statistics.median(e.image_rate) <= 0.15, e.image_rate
    assert max(e.image_rate) <= (0.15 if exact else 0.30), e.image_rate
    assert max(e.layer_over_reported) <= 1.0 + 1e-9
    # Steps dated by polls (0.25 s apart) can make a fast layer's step look shorter.
    assert max(e.layer_over_link) <= (1.0 + 1e-9 if exact else 1.1)
    median, worst = (0.15, 0.30) if exact else (0.25, 0.40)
    assert statistics.median(e.image_eta + e.pod_eta) <= median, (e.image_eta, e.pod_eta)
    assert max(e.image_eta + e.pod_eta) <= worst, (e.image_eta, e.pod_eta)
    assert statistics.median(e.layer_eta) <= median and p90(e.layer_eta) <= worst, e.layer_eta


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_rates_and_etas_hold_on_a_shared_link(name: str) -> None:
    """containerd 2.x: 1 MiB steps, each stamped by its ingest's updated_at."""
    rate, pulls = SCENARIOS[name]
    _assert_goals(await run_trace(rate, pulls), len(pulls))


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != "3 layers @50kB/s"])
async def test_without_update_times_the_poll_that_saw_a_step_dates_it(name: str) -> None:
    """A runtime that gives no updated_at: steps are dated by the poll that saw them,
    at most one poll interval late, and a counter's first step only dates it (so the
    50 kB/s scenario, whose 2 MB layer steps once, is left out: nothing measures it)."""
    rate, pulls = SCENARIOS[name]
    _assert_goals(await run_trace(rate, pulls, exact_times=False), len(pulls), exact=False)


@pytest.mark.parametrize("name", ["3 layers @400kB/s (issue 23)", "two pulls @400kB/s"])
async def test_smooth_offsets_as_on_containerd_16(name: str) -> None:
    """containerd 1.6 moves offsets smoothly (32 KiB writes here)."""
    rate, pulls = SCENARIOS[name]
    _assert_goals(await run_trace(rate, pulls, step=32 << 10), len(pulls))


# derandomize: the same 12 draws every run, so a run never passes or fails by the draw.
# Over 120 random draws (seed 11) the worst were 17% (rate) and 31% (ETA); before the
# link was measured across completions, 46% and 91% (the link read 60% of itself for a
# step's time after each completion on a slow link).
@settings(max_examples=12, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rate=st.sampled_from([120 * KB, 400 * KB, 1500 * KB]),
       layers=st.lists(st.tuples(st.integers(3 * MiB, 12 * MiB), st.floats(0.5, 2.0)),
                       min_size=1, max_size=6))
async def test_any_image_on_any_link(rate: float, layers: list[tuple[int, float]]) -> None:
    """Layer sizes, shares and link rates drawn at random: the image's rate and ETA at
    25, 50 and 75% of its bytes near the truth. Layers of 3 MiB move in 3 steps, so a
    slow one that has not stepped yet is anywhere within a third of itself: the bounds
    are looser than for the named scenarios."""
    e = await run_trace(rate, [Pull("127.0.0.1:5000/a:1", [s for s, _ in layers],
                                    [w for _, w in layers])])
    assert not [m for m in e.missing if not m.startswith("layer")], e.missing
    assert max(e.image_rate) <= 0.20, e.image_rate
    assert statistics.median(e.image_eta) <= 0.15 and max(e.image_eta) <= 0.35, e.image_eta
    assert max(e.layer_over_link) <= 1.0 + 1e-9


async def test_layers_limited_each_on_its_own_keep_their_own_rates() -> None:
    """No shared link: a registry that limits each download on its own (here 3, 1 and
    0.25 MB/s). The engine assumes a shared link until a layer finishes and the others
    do not speed up; from then on (once a window after it has passed) each layer's ETA
    is its own bytes left over its own rate."""
    e = await run_trace(0.0, [Pull(A, [24 * MB, 15 * MB, 6 * MB], [3e6, 1e6, 0.25e6])],
                        shared=False)
    assert e.first_done is not None
    after = [x for x, t in zip(e.layer_eta, e.layer_eta_at, strict=True)
             if t >= e.first_done + 2.0]
    assert after and max(after) <= 0.15, (after, e.layer_eta, e.layer_eta_at, e.first_done)
    # (The image's rate lags a window after a completion here: its window still holds
    # the finished layer's bytes, which on a shared link would have gone to the others.)
    assert max(e.layer_over_reported) <= 1.0 + 1e-9


@pytest.mark.parametrize("exact", [True, False])
async def test_one_step_from_the_ingests_start_gives_a_rate(exact: bool) -> None:
    """A 3 MiB layer at 50 kB/s steps at 21 and 42 s of 63 (bench scenario l1-50k): the
    ingest's started_at is offset 0 at a known time, so from the first step on the
    layer, image and pod have a rate and an ETA (before: null until the second step,
    i.e. at 50% of the bytes). With or without updated_at: started_at alone dates the
    start, and the first step is then dated by the poll that saw it."""
    e = await run_trace(50 * KB, [Pull(A, [3 * MiB], [1.0])], exact_times=exact,
                        min_moves=1)
    assert not e.missing, e.missing
    assert len(e.layer_eta) == 2 and len(e.image_eta) == 2  # at 50% and 75%
    assert max(e.layer_eta + e.image_eta + e.pod_eta) <= 0.05, (e.layer_eta, e.image_eta)
    assert max(e.image_rate + e.pod_rate) <= 0.05, (e.image_rate, e.pod_rate)


async def test_a_layer_waiting_for_a_node_slot_is_not_timed_from_its_ingest() -> None:
    """Bench scenario 2pods-400k: two pulls of 8 and 4 MiB at once, containerd 2.x's three
    download slots shared by the node. The fourth layer's ingest is open at offset 0
    from the start but its bytes begin only when a 4 MiB layer finishes (31 s later).
    Timed from its started_at it showed 29 kB/s, then 50 kB/s, on a 200 kB/s share."""
    e = await run_trace(400 * KB, [Pull(A, [8 * MiB, 4 * MiB], [1.0, 1.0]),
                                   Pull(B, [8 * MiB, 4 * MiB], [1.0, 1.0])], node_slots=3)
    _assert_goals(e, 2)


@pytest.mark.parametrize(("rate", "mib"), [(400 * KB, [8, 6, 4, 3, 2, 1]),
                                           (5000 * KB, [40, 25, 15, 12, 8, 5])])
async def test_every_ingest_opened_at_once_three_downloading(rate: float,
                                                             mib: list[int]) -> None:
    """As containerd 2.4 does it (bench l6-400k, l6-5m): a pull opens all six layers'
    ingests at once, at offset 0, and three download; each of the rest begins when one
    finishes. The idle ones must not pass for slow downloads (nor be timed from their
    started_at), and the running ones must not lose their start when one finishes."""
    e = await run_trace(rate, [Pull(A, [m * MiB for m in mib], [1.0] * 6)], node_slots=3,
                        per_pull=6)
    assert not e.missing, e.missing
    assert max(e.image_rate + e.pod_rate) <= 0.15, (e.image_rate, e.pod_rate)
    assert max(e.layer_over_link) <= 1.0 + 1e-9
    assert max(e.image_eta + e.pod_eta) <= 0.30, (e.image_eta, e.pod_eta)
    # Which idle ingest gets the next slot is not shown (taken first opened first):
    # the waiting layers' own ETAs are looser than the image's.
    assert statistics.median(e.layer_eta) <= 0.15 and p90(e.layer_eta) <= 0.35, e.layer_eta


async def test_a_layer_that_has_not_stepped_counts_down_from_its_slot() -> None:
    """Bench l6-400k: 8..1 MiB layers, three download at once and each of the rest
    starts when one finishes. A 2 MiB layer's first step lands at half its bytes: until
    then its bytes in flight grow with the time since its slot freed, at the others'
    pace, and its ETA counts down with them (it stood still at 11.7 s, taking half a
    step in flight, while 15.7 s went to 7.9 s)."""
    e = await run_trace(400 * KB, [Pull(A, [m * MiB for m in (8, 6, 4, 3, 2, 1)],
                                        [1.0] * 6)], node_slots=3, per_pull=6)
    errors = [x for x, _ in e.unstepped_eta]
    assert len(errors) >= 40, e.unstepped_eta  # every poll of every such layer
    assert statistics.median(errors) <= 0.10 and max(errors) <= 0.30, e.unstepped_eta


@pytest.mark.parametrize("idle", [None, 15.0])
@pytest.mark.parametrize("trace", sorted(p.name for p in TRACES.glob("*.json")))
async def test_a_recorded_bench_pull_replays_within_the_goals(trace: str,
                                                             idle: float | None) -> None:
    """A pull the accuracy bench recorded on the real kubelet and containerd 2.4.2 (each
    layer's bytes as they left the throttle, at every whole MiB), replayed with every
    ingest open from the start as containerd 2.4 opens them. l6-5m: layers got slots in
    the order 1, 3, 6, then 4, 2, 5; before c9dc579 the image's ETA at 25% and 50% was
    7x and 9x the time left (the bench saw 107 s for 16.5 s). Also 15 s after an earlier
    pull the engine followed, as in the bench (scenarios run one after another): that
    pull's bytes must not dilute the link's rate."""
    rec = json.loads((TRACES / trace).read_text())
    sizes = [int(la["steps"][-1][1]) for la in rec["layers"]]
    e = await run_trace(float(rec["rate"]), [Pull(A, sizes, [1.0] * len(sizes))],
                        recorded=rec, idle_before=idle)
    assert not [m for m in e.missing if not m.startswith("layer")], e.missing
    assert max(e.image_rate + e.pod_rate) <= 0.15, (e.image_rate, e.pod_rate)
    assert max(e.image_eta + e.pod_eta) <= 0.30, (e.image_eta, e.pod_eta)
    assert statistics.median(e.layer_eta) <= 0.15, e.layer_eta
    assert p90(e.layer_eta) <= 0.30, e.layer_eta
    # A layer that has not stepped yet, timed from when its slot freed: l6-400k's 3 MiB
    # layer was 25-40% off for the 8 s before its first step when the engine took it
    # to have run from its ingest's start (its slot went by a guess to another).
    assert max((x for x, _ in e.unstepped_eta), default=0.0) <= 0.15, e.unstepped_eta
    # Every running layer's ETA at every poll (before: p90 27%, 75% and 17% on l3-400k,
    # l6-400k and l6-5m; a layer's bytes since its last step came at its own rate,
    # which lags its new share for a window after a sibling finishes).
    assert p90([x for x, _, _ in e.running_eta]) <= 0.25, e.running_eta
