"""The step-aware rate of one counter (aggapi.agent.progress.rate) and the shared-link
plan (aggapi.agent.progress.eta), driven directly."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from aggapi.agent.progress.counters import Counter, CounterBook
from aggapi.agent.progress.eta import Flow, plan
from aggapi.agent.progress.rate import LONG_SPAN

MiB = 1 << 20


def stepped(rate: float, step: int, steps: int, exact: bool = True) -> Counter:
    """A counter fed as containerd 2.x shows a download at ``rate``: one observation
    per 0.25 s poll, the offset moving a whole ``step`` at a time."""
    c = Counter()
    t, got = 0.0, 0
    c.observe(0.0, 0, 0.0 if exact else None)
    while got < steps * step:
        t += 0.25
        k = int(rate * t // step) * step
        if k > got:
            got = min(k, steps * step)
            c.observe(t, got, got / rate if exact else None)
    return c


@given(seconds_per_step=st.floats(0.3, 60.0), step=st.sampled_from([32 << 10, MiB]),
       steps=st.integers(2, 12))
def test_a_steady_download_is_measured_exactly_whatever_the_step(
        seconds_per_step: float, step: int, steps: int) -> None:
    rate = step / seconds_per_step  # a step takes longer than a poll: each is seen
    c = stepped(rate, step, steps)
    last = c.points[-1][0]
    got = c.frozen().rate(last)
    assert got is not None and abs(got - rate) / rate < 1e-6


@given(rate=st.floats(50_000, 2_000_000), steps=st.integers(3, 12))
def test_steps_dated_by_polls_are_within_a_poll_of_the_truth(rate: float, steps: int) -> None:
    c = stepped(rate, MiB, steps, exact=False)
    got = c.frozen().rate(c.points[-1][0])
    assert got is not None
    # Each end of the span measured (>= LONG_SPAN s when there is that much) is at most
    # one poll (0.25 s) late.
    span = min(c.points[-1][0] - c.points[0][0], LONG_SPAN)
    assert abs(got - rate) / rate <= 0.25 / (span - 0.25) + 1e-9


def test_a_counter_that_has_not_moved_twice_has_no_rate() -> None:
    c = Counter()
    c.observe(0.0, 0, 0.0)
    assert c.frozen().rate(5.0) is None
    c.observe(8.0, MiB, 8.0)
    assert c.frozen().rate(9.0) is None  # one step: no rate yet
    c.observe(16.0, 2 * MiB, 16.0)
    assert c.frozen().rate(16.0) == MiB / 8


def test_an_overdue_counter_decays() -> None:
    """A 1 MiB step every 8 s, then nothing: past the due time the rate is at most
    (bytes + one step) / elapsed, so it falls as the wait grows."""
    c = stepped(MiB / 8, MiB, 4)
    tr = c.frozen()
    due = c.points[-1][0] + 8
    assert tr.rate(due) == MiB / 8
    later = [r for d in (4, 16, 64) if (r := tr.rate(due + d)) is not None]
    assert len(later) == 3 and later == sorted(later, reverse=True)
    assert later[-1] < MiB / 8 / 2


def test_a_clear_change_of_rate_is_followed_within_two_steps() -> None:
    c = Counter()
    t, v = 0.0, 0
    c.observe(t, v, t)
    for _ in range(8):  # 8 steps at 128 KiB/s
        t, v = t + 8, v + MiB
        c.observe(t, v, t)
    for _ in range(2):  # then twice as fast (a sibling layer finished)
        t, v = t + 4, v + MiB
        c.observe(t, v, t)
    assert c.frozen().rate(t) == MiB / 4


def test_memory_is_bounded() -> None:
    c = Counter()
    for i in range(1000):
        c.observe(i * 0.25, i * 4096, i * 0.25)
    assert len(c.points) == 64 and c.frozen().rate(250.0) == 4096 * 4
    book = CounterBook()
    for i in range(100):
        book.observe(f"d{i}", 0.0, 0, 0.0, MiB)
    book.sweep(1.0, {})  # all observed: kept
    assert len(book) == 100
    book.sweep(2.0, {})  # none observed: finished now
    assert len(book) == 100
    book.sweep(2.0 + 61, {})  # a minute after finishing: gone
    assert len(book) == 0


def test_a_finished_layer_hands_its_share_to_the_others() -> None:
    """Two layers on a 300 B/s link, shares 2:1: the first finishes 300 bytes at 200 B/s
    (1.5 s); the second has 900 - 150 = 750 left at the full 300 B/s: 2.5 s more."""
    p = plan([Flow("a", "L", 300, 200.0, True), Flow("b", "L", 900, 100.0, True)], 300.0,
             {"L": 2})
    assert p.finish == {"a": 1.5, "b": 4.0}
    assert p.share == {"a": 200.0, "b": 100.0}


def test_queued_layers_start_as_running_ones_finish() -> None:
    """One slot per pull: b waits for a, then has the link alone; c (another pull)
    shares it all along."""
    p = plan([Flow("a", "L1", 100, None, True), Flow("b", "L1", 100, None, False),
              Flow("c", "L2", 300, None, True)], 100.0, {"L1": 1, "L2": 1})
    # a and c at 50 B/s each: a done at 2 s; b and c at 50: b done at 4 s, c has 100
    # left at 4 s... c: 300 - 4 * 50 = 100 left, alone at 100 B/s: 5 s.
    assert p.finish == {"a": 2.0, "b": 4.0, "c": 5.0}


@given(sizes=st.lists(st.integers(1, 10**9), min_size=1, max_size=12),
       link=st.floats(1_000, 10**8))
def test_the_plan_conserves_work(sizes: list[int], link: float) -> None:
    """However the link is shared, the last byte arrives at Σbytes / link."""
    flows = [Flow(str(i), "L", s, float(i % 3 + 1), i < 3) for i, s in enumerate(sizes)]
    p = plan(flows, link, {"L": 3})
    assert abs(max(p.finish.values()) - sum(sizes) / link) <= 1e-6 * sum(sizes) / link


@given(rate=st.floats(20e3, 5e6), late=st.floats(0.0, 30.0))
def test_started_at_makes_the_first_step_a_measurement(rate: float, late: float) -> None:
    """First seen ``late`` seconds into the download, one 1 MiB step in or not: with the
    ingest's started_at as offset 0, the first step gives the rate (it had none before
    its second step); without started_at it still has none."""
    t1 = MiB / rate
    seen = min(late, t1 * 0.99)
    for started in (100.0, None):
        c = Counter()
        c.observe(100.0 + seen, 0, None, started)
        c.observe(100.0 + t1 + 0.1, MiB, 100.0 + t1, started)
        got = c.frozen().rate(100.0 + t1)
        if started is None:
            assert got is None
        else:
            assert got is not None and abs(got - rate) / rate < 1e-6


@given(after=st.floats(0.05, 20.0), link=st.sampled_from([400e3, 5e6]))
def test_a_first_step_is_timed_from_its_slot_only_if_it_could_have_begun_there(
        after: float, link: float) -> None:
    """Opened at offset 0 at t=100 (started_at) and taken as waiting for a download
    slot; a completion freed one at t=130 and its first 1 MiB step came ``after`` s
    later. Faster than the link from the slot: it was running before, its start
    stands. Otherwise its start is dropped and its first bytes spread from the slot
    (a download that waited 30 s would otherwise read 30 times too slow)."""
    c = Counter()
    c.observe(100.5, 0, 100.0, 100.0)
    c.slot_at = 130.0
    c.observe(130.0 + after + 0.1, MiB, 130.0 + after, 100.0)
    c.queued_start(link)
    tr = c.frozen()
    if MiB / after > link * 1.05:
        assert tr.points[0] == (100.0, 0) and tr.rate(130.0 + after) is not None
    else:
        assert tr.points == ((130.0 + after, MiB),) and tr.soft_start == 130.0
        assert tr.rate(130.0 + after) is None  # measured from its next step on
        assert abs(tr.value_at(130.0 + after / 2, None) - MiB / 2) < 1e-3


def test_each_completion_frees_a_slot_for_the_download_that_waited_longest() -> None:
    """Six ingests opened at once, three slots (bench l6-400k): the two taken as waiting
    get the slots of the next two completions, first opened first."""
    book = CounterBook()
    for k, t0 in (("run1", 1.0), ("run2", 1.0), ("wait1", 1.01), ("wait2", 1.02)):
        book.observe(k, 1.5, 0, t0, 4 * MiB, t0)
    book.sweep(1.5, {})
    book.queued = ["wait1", "wait2"]
    for t, live in ((7.0, ("run2", "wait1", "wait2")), (31.0, ("wait1", "wait2"))):
        for k in live:
            book.observe(k, t + 0.1, 0, 1.0, 4 * MiB, 1.0)
        book.sweep(t + 0.1, {"run1": 7.0, "run2": 31.0})
    assert book.counters["wait1"].slot_at == 7.0
    assert book.counters["wait2"].slot_at == 31.0


def test_an_earlier_pull_does_not_dilute_the_link() -> None:
    """A pull at 1 MB/s finished 15 s before the next began (the node idle between);
    the next one's three layers run at 5 MB/s together. The link is 5 MB/s, not the
    bytes of both over a window that holds the idle time (the bench's l6-5m, run 15 s
    after l3-5m, read 1.9 MB/s at 1.3 s and gave its first layer 3x its ETA)."""
    book = CounterBook()
    t = 0.0
    while t < 10.0:  # the earlier pull: one layer, 10 MiB at ~1 MiB/s
        t += 0.25
        book.observe("old", t, min(int(t) * MiB, 10 * MiB), float(int(t)), 10 * MiB, 0.0)
        book.sweep(t, {})
    book.sweep(t + 0.25, {"old": t})
    start = 25.0
    for i in range(1, 9):  # three layers from 25 s, each stepping 1 MiB every 0.6 s
        now = start + 0.25 * i
        for k in ("a", "b", "c"):
            book.observe(k, now, int((now - start) / 0.6) * MiB,
                         start + 0.6 * int((now - start) / 0.6), 40 * MiB, start)
        book.sweep(now, {})
    link = book.snapshot(now).group(book.counters)
    assert link is not None and abs(link - 3 * MiB / 0.6) / (3 * MiB / 0.6) <= 0.2, link


def test_a_layer_that_took_a_finished_ones_slot_is_measured_with_it() -> None:
    """Bench 2pods-400k: a layer opened at 0 waits for a node slot; the slot of a 4 MiB
    layer finishing at 30 s goes to it and its first step comes at 35 s. The two belong
    to one busy spell: their bytes together have a rate (after the earlier-pull rule
    first came in, the image's rate was null there, scored 100% at 50%)."""
    t0 = 1000.0
    book = CounterBook()
    book.link = 400_000.0
    book.queued = ["late"]
    for i in range(1, 141):
        now = t0 + 0.25 * i
        got = min(int((now - t0) / 7.5) * MiB, 4 * MiB)
        if now <= t0 + 30.0:
            book.observe("first", now, got, t0 + 7.5 * int((now - t0) / 7.5), 4 * MiB, t0)
        stepped = now >= t0 + 35.0
        book.observe("late", now, MiB if stepped else 0, t0 + 35.0 if stepped else None,
                     8 * MiB, t0)
        book.sweep(now, {"first": t0 + 30.0} if now > t0 + 30.0 else {})
    late = book.counters["late"].frozen()
    assert late.slot_at == t0 + 30.0 and late.soft_start == t0 + 30.0, late
    rate = book.snapshot(t0 + 35.0).group(["first", "late"])
    assert rate is not None and rate > 0, rate
