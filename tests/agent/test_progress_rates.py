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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.progress.containerd_backend import ContainerdBackend
from aggapi.agent.progress.model import NodeState
from aggapi.agent.progress.ocimanifest import Platform
from aggapi.agent.progress.view import objects
from aggapi.auth.capability import ContainerRef
from tests.agent.fakectd import FakeContainerd, FakeImage, make_image
from tests.agent.linksim import MiB, RecordedLink, SharedLink, SimLayer

T0 = 1_000_000.0
CHECKPOINTS = (0.25, 0.5, 0.75)


@dataclass
class Pull:
    ref: str
    sizes: Sequence[int]
    weights: Sequence[float]


@dataclass
class Errors:
    """Relative errors at the checkpoints: |reported - real| / real."""

    layer_eta: list[float] = field(default_factory=list)
    layer_eta_at: list[float] = field(default_factory=list)  # when each was taken
    first_done: float | None = None  # when the first layer finished
    image_eta: list[float] = field(default_factory=list)
    image_rate: list[float] = field(default_factory=list)
    pod_rate: list[float] = field(default_factory=list)
    pod_eta: list[float] = field(default_factory=list)
    layer_over_link: list[float] = field(default_factory=list)  # layer rate / real link
    layer_over_reported: list[float] = field(default_factory=list)  # / reported link
    missing: list[str] = field(default_factory=list)  # checkpoints with no figure
    # At every poll, the ETAs of running layers that have not stepped yet but have a
    # quarter of a step in flight: (error, when).
    unstepped_eta: list[tuple[float, float]] = field(default_factory=list)
    # At every poll, the ETAs of every running layer with a figure: (error, when, which).
    running_eta: list[tuple[float, float, str]] = field(default_factory=list)
    # Every layer's, image's and pod's ETA error at each checkpoint, as the accuracy
    # bench scores it (no figure counts 1.0): (checkpoint, error).
    scored: list[tuple[float, float]] = field(default_factory=list)


def _err(reported: float | None, real: float, what: str, out: list[float],
         missing: list[str], moves: int, min_moves: int = 2) -> None:
    """``moves``: steps the node's counters (or the layer's, for a layer's rate) have
    taken; with fewer than ``min_moves`` there is nothing to measure, and no figure is
    right."""
    if real <= 0:
        return  # already in: nothing left to predict
    if reported is None:
        if moves >= min_moves:
            missing.append(what)
    else:
        out.append(abs(reported - real) / real)


def _score(reported: float | None, real: float, c: float, errs: Errors) -> None:
    if real > 0:
        errs.scored.append((c, 1.0 if reported is None else abs(reported - real) / real))


def _moves(link: SharedLink | RecordedLink, keys: Sequence[str] | None = None,
           exact: bool = True) -> int:
    """Steps measured: without update times a counter's first step only dates it."""
    n = 0
    for d in keys if keys is not None else list(link.written):
        if d in link.written:
            m = link.written[d][0] // link.step + (d in link.done)
            n += m if exact else max(m - 1, 0)
    return n


async def run_trace(rate: float, pulls: Sequence[Pull], *, step: int = MiB,
                    poll: float = 0.25, exact_times: bool = True,
                    shared: bool = True, min_moves: int = 2,
                    node_slots: int | None = None, per_pull: int = 3,
                    admit: Sequence[int] | None = None,
                    recorded: dict[str, object] | None = None,
                    idle_before: float | None = None, received: bool = False,
                    elsewhere: Sequence[Pull] = ()) -> Errors:
    """Pull everything through the simulated link, observing every ``poll`` s.
    ``idle_before``: the same engine followed an earlier pull (8 MiB at ``rate``)
    that ended this long before, as on a node that pulls one image after another.
    ``received``: the engine also reads the bytes containerd received over TCP (every
    byte the link carried so far, as aggapi.agent.progress.sockbytes counts them).
    ``elsewhere``: pulls on another node that share the link; this node sees none of
    their bytes (2nodes-400k-uneven)."""
    fake = FakeContainerd(now=T0)
    link: SharedLink | RecordedLink | None = None

    def got() -> int:
        return int(sum(n for d, n in link.got.items() if d in sizes)) if link else 0

    be = ContainerdBackend(fake, Platform("linux", "amd64"), clock=lambda: fake.now,
                           monotonic=lambda: fake.now, received=got if received else None)
    if idle_before is not None:
        await _earlier_pull(fake, be, rate, idle_before, poll)
    images: dict[str, FakeImage] = {}
    sim_layers: list[SimLayer] = []
    for i, p in enumerate(pulls):
        img = images[p.ref] = make_image(p.ref, p.sizes, f"img{i}")
        lease = f"L{i}"
        fake.start_pull(img, lease)
        fake.fetch_manifest(img, lease)
        for (digest, size), w in zip(img.layers, p.weights, strict=True):
            sim_layers.append(SimLayer(digest, size, w, lease))
    sizes = {la.digest: la.size for la in sim_layers}  # this node's layers
    for i, p in enumerate(elsewhere):
        img = make_image(p.ref, p.sizes, f"other{i}")
        for (digest, size), w in zip(img.layers, p.weights, strict=True):
            sim_layers.append(SimLayer(digest, size, w, f"N{i}"))
    link = (
        SharedLink(rate, sim_layers, per_pull, step=step, shared=shared,
                   node_slots=node_slots, admit=admit) if recorded is None else
        RecordedLink(recorded, [la.digest for la in sim_layers], "L0", step))
    finish = link.finish_times()
    of_image = {ref: [d for d, _ in img.layers] for ref, img in images.items()}
    total_all = sum(sizes.values())
    pod = [ContainerRef(f"c{i}", p.ref) for i, p in enumerate(pulls)]
    pending = {(kind, key, c) for c in CHECKPOINTS
               for kind, keys in (("layer", sizes), ("image", of_image), ("pod", ["pod"]))
               for key in keys}
    errs = Errors()
    committed: set[str] = set()
    while not link.finished():
        link.run_until(link.t + poll)
        fake.now = T0 + link.t
        for ing in link.ingests():
            if ing.digest not in sizes:
                continue  # another node's
            fake.download(ing.digest, ing.offset, ing.total, ing.pull,
                          updated_at=T0 + ing.updated_at if exact_times else 0.0,
                          started_at=T0 + ing.started_at)
        for d, at in link.done.items():
            if d not in committed and d in sizes:
                committed.add(d)
                now, fake.now = fake.now, T0 + at
                fake.commit(d, sizes[d], next(la.pull for la in sim_layers if la.digest == d))
                fake.now = now
        state = await be.observe(list(images))
        _check(state, link, finish, of_image, sizes, total_all, pod, pending, errs,
               exact_times, min_moves)
    return errs


async def _earlier_pull(fake: FakeContainerd, be: ContainerdBackend, rate: float,
                        idle: float, poll: float) -> None:
    """One 8 MiB layer at ``rate`` in 1 MiB steps, ending ``idle`` s before T0."""
    size = 8 * MiB
    img = make_image("127.0.0.1:5000/earlier:1", [size], "earlier")
    start = T0 - idle - size / rate
    fake.now = start
    fake.start_pull(img, "P")
    fake.fetch_manifest(img, "P")
    digest = img.layers[0][0]
    while fake.now < start + size / rate:
        fake.now += poll
        got = int(min(rate * (fake.now - start), size) // MiB) * MiB
        fake.download(digest, got, size, "P", updated_at=start + got / rate, started_at=start)
        await be.observe([img.name])
    fake.commit(digest, size, "P")
    fake.finish(img, "P")
    await be.observe([img.name])
    fake.now = T0


def _check(state: NodeState, link: SharedLink | RecordedLink, finish: dict[str, float],
           of_image: dict[str, list[str]], sizes: dict[str, int], total_all: int,
           pod: Sequence[ContainerRef], pending: set[tuple[str, str, float]],
           errs: Errors, exact: bool, min_moves: int = 2) -> None:
    shares = {d: r for d, r in link.shares().items() if d in sizes}  # this node's
    real_link = sum(shares.values())
    if link.done and errs.first_done is None:
        errs.first_done = min(link.done.values())
    t = link.t
    for ref, img in state.images.items():
        layers = {la.digest: la for la in img.layers}
        for la in img.layers:
            if la.bytes_per_second is not None and real_link:
                errs.layer_over_link.append(la.bytes_per_second / real_link)
                # (getattr: so this test fails on its assertions at 622964a.)
                reported_link = getattr(state, "link_bytes_per_second", None)
                if reported_link is not None:
                    errs.layer_over_reported.append(la.bytes_per_second / reported_link)
        for d in of_image[ref]:
            said = layers[d].eta_seconds
            if d in link.started and d not in link.done and said is not None:
                errs.running_eta.append((abs(said - (finish[d] - t)) / (finish[d] - t), t, d))
            if (d in link.started and d not in link.done and said is not None
                    and link.written.get(d, (0, 0.0))[0] == 0
                    and link.got.get(d, 0) >= link.step / 4):
                errs.unstepped_eta.append((abs(said - (finish[d] - t)) / (finish[d] - t), t))
            for c in CHECKPOINTS:
                if ("layer", d, c) in pending and link.got.get(d, 0) >= c * sizes[d] \
                        and d not in link.done:
                    pending.discard(("layer", d, c))
                    n = len(errs.layer_eta)
                    _score(layers[d].eta_seconds, finish[d] - t, c, errs)
                    _err(layers[d].eta_seconds, finish[d] - t, f"layer eta {d[:12]} {c}",
                         errs.layer_eta, errs.missing, _moves(link, None, exact), min_moves)
                    errs.layer_eta_at += [t] * (len(errs.layer_eta) - n)
        got = sum(link.got.get(d, 0) for d in of_image[ref])
        total = sum(sizes[d] for d in of_image[ref])
        for c in CHECKPOINTS:
            if ("image", ref, c) in pending and got >= c * total:
                pending.discard(("image", ref, c))
                real_rate = sum(shares.get(d, 0.0) for d in of_image[ref])
                end = max(finish[d] for d in of_image[ref])
                _score(img.eta_seconds, end - t, c, errs)
                _err(img.eta_seconds, end - t, f"image eta {ref} {c}", errs.image_eta,
                     errs.missing, _moves(link, None, exact), min_moves)
                _err(img.bytes_per_second, real_rate, f"image rate {ref} {c}",
                     errs.image_rate, errs.missing, _moves(link, of_image[ref], exact),
                     min_moves)
    got_all = sum(n for d, n in link.got.items() if d in sizes)
    for c in CHECKPOINTS:
        if ("pod", "pod", c) in pending and got_all >= c * total_all:
            pending.discard(("pod", "pod", c))
            o = objects(pod, state, "pod")[0]
            _err(o["bytesPerSecond"], real_link, f"pod rate {c}", errs.pod_rate, errs.missing,
                 _moves(link, None, exact), min_moves)
            _score(o["etaSeconds"], max(finish[d] for d in sizes) - t, c, errs)
            _err(o["etaSeconds"], max(finish[d] for d in sizes) - t, f"pod eta {c}", errs.pod_eta,
                 errs.missing, _moves(link, None, exact), min_moves)


def _p90(xs: Sequence[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, int(0.9 * len(xs)))]


KB, MB = 1000, 1_000_000
A, B = "127.0.0.1:5000/a:1", "127.0.0.1:5000/b:1"
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
    assert statistics.median(e.layer_eta) <= median and _p90(e.layer_eta) <= worst, e.layer_eta


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
    assert statistics.median(e.layer_eta) <= 0.15 and _p90(e.layer_eta) <= 0.35, e.layer_eta


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


TRACES = Path(__file__).parent / "traces"


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
    assert _p90(e.layer_eta) <= 0.30, e.layer_eta
    # A layer that has not stepped yet, timed from when its slot freed: l6-400k's 3 MiB
    # layer was 25-40% off for the 8 s before its first step when the engine took it
    # to have run from its ingest's start (its slot went by a guess to another).
    assert max((x for x, _ in e.unstepped_eta), default=0.0) <= 0.15, e.unstepped_eta
    # Every running layer's ETA at every poll (before: p90 27%, 75% and 17% on l3-400k,
    # l6-400k and l6-5m; a layer's bytes since its last step came at its own rate,
    # which lags its new share for a window after a sibling finishes).
    assert _p90([x for x, _, _ in e.running_eta]) <= 0.25, e.running_eta


EARLY = {  # the bench's scenarios whose first steps come late (issue 37, item 4)
    "l1-50k": (50 * KB, [Pull(A, [3 * MiB], [1.0])], None),
    "l3-400k": (400 * KB, [Pull(A, [10 * MiB, 6 * MiB, 2 * MiB], [1.0, 0.9, 1.1])], None),
    "l6-400k": (400 * KB, [Pull(A, [m * MiB for m in (8, 6, 4, 3, 2, 1)], [1.0] * 6)], 3),
    "2pods-400k": (400 * KB, [Pull(A, [8 * MiB, 4 * MiB], [1.0, 1.0]),
                              Pull(B, [8 * MiB, 4 * MiB], [1.0, 1.0])], 3),
}


@pytest.mark.parametrize("name", list(EARLY))
async def test_containerds_received_bytes_time_layers_before_their_first_step(
        name: str) -> None:
    """Before any layer moves one 1 MiB step nothing on the ingests tells the link's
    rate: at 25% of a 1-3 MiB layer's bytes (and at 50% of l3-400k's 2 MiB layer) the
    ETA was null. The bytes containerd received over TCP (sockbytes) time the link from
    its first second: every layer, image and pod has an ETA at every checkpoint, and at
    25% 90% of them are within 30% (the bench's goal, overall.eta_error_p90_at_25)."""
    rate, pulls, slots = EARLY[name]
    e = await run_trace(rate, pulls, node_slots=slots, per_pull=6, received=True)
    assert not e.missing, e.missing
    at25 = [x for c, x in e.scored if c == 0.25]
    assert max(x for _, x in e.scored) < 1.0, e.scored  # no null ETA anywhere
    assert _p90(at25) <= 0.30, at25
    assert _p90([x for c, x in e.scored if c == 0.5]) <= 0.15, e.scored


@pytest.mark.parametrize("trace", sorted(p.name for p in TRACES.glob("*.json")))
async def test_received_bytes_keep_a_recorded_pull_within_the_goals(trace: str) -> None:
    """The recorded bench pulls, with containerd's received bytes read as well: no null
    ETA at any checkpoint (l3-400k's 2 MiB layer and l6-400k's 1 MiB one had none at
    25% and 50%), and at each checkpoint no worse than timed by the steps alone."""
    rec = json.loads((TRACES / trace).read_text())
    sizes = [int(la["steps"][-1][1]) for la in rec["layers"]]
    pulls = [Pull(A, sizes, [1.0] * len(sizes))]
    steps = await run_trace(float(rec["rate"]), pulls, recorded=rec)
    e = await run_trace(float(rec["rate"]), pulls, recorded=rec, received=True)
    assert max(x for _, x in e.scored) < 1.0, e.scored
    for c in CHECKPOINTS:
        assert _p90([x for at, x in e.scored if at == c]) <= _p90(
            [x for at, x in steps.scored if at == c]) + 0.01, (c, e.scored, steps.scored)
    assert max(e.image_rate + e.pod_rate) <= 0.15, (e.image_rate, e.pod_rate)
    assert max(e.image_eta + e.pod_eta) <= 0.30, (e.image_eta, e.pod_eta)
    assert _p90(e.layer_eta) <= 0.30, e.layer_eta


async def test_received_bytes_show_the_link_free_up_when_another_nodes_pull_ends() -> None:
    """2nodes-400k-uneven as one node sees it: its 8 and 4 MiB layers share the link
    with a 3 MiB layer on another node, whose end (at half this node's bytes) nothing
    here shows but the bytes containerd receives: they come faster at once, where the
    layers' steps (uneven shares, 1.2 and 0.8) took a window of steps to say so (75%:
    39% off). The 50% checkpoint falls on the other node's end: only the apiserver,
    which sees both nodes, could foresee that (issue 37, item 3)."""
    e = await run_trace(400 * KB, [Pull(A, [8 * MiB, 4 * MiB], [1.2, 0.8])], received=True,
                        elsewhere=[Pull(B, [3 * MiB], [1.0])])
    at75 = [x for c, x in e.scored if c == 0.75]
    assert at75 and max(at75) <= 0.15, e.scored
