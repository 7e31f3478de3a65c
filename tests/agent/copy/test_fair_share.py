"""Fair sharing of a node's copy slots and copy worker threads between namespaces and
requests (issue 24, findings 4 and 5): one tenant cannot hold every slot, and a small
copy's calls are not queued behind a big copy's backlog."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from aggapi.agent.config import from_args
from aggapi.agent.copy import workers as wk
from aggapi.agent.copy.quotas import CopyLimits, CopySlots
from aggapi.agent.copy.workers import Workers
from aggapi.status import StatusError

WAIT = 10.0  # a bound only a broken scheduler reaches


def _blocker() -> tuple[threading.Event, threading.Event, Callable[[], None]]:
    started, release = threading.Event(), threading.Event()

    def block() -> None:
        started.set()
        release.wait(WAIT)

    return started, release, block


async def _started(ev: threading.Event) -> None:
    assert await asyncio.to_thread(ev.wait, WAIT)


async def test_a_small_request_is_served_before_a_big_ones_backlog() -> None:
    """One thread, held by request A; A queues five more calls, then B queues one: B's
    runs after at most one more of A's (round-robin between requests), not after A's
    whole backlog (first come, first served)."""
    w = Workers(1)
    order: list[str] = []
    started, release, block = _blocker()
    try:
        async def big() -> None:
            first = w.submit(block)
            rest = [w.submit(order.append, f"a{i}") for i in range(5)]
            await first
            await asyncio.gather(*rest)

        a = asyncio.create_task(big())
        await _started(started)
        await asyncio.sleep(0)  # A has queued its backlog
        b = asyncio.ensure_future(w.run(order.append, "b"))
        await asyncio.sleep(0)  # B has queued its call
        release.set()
        await asyncio.wait_for(asyncio.gather(a, b), WAIT)
        assert order.index("b") <= 1, order
        assert [x for x in order if x != "b"] == [f"a{i}" for i in range(5)]
    finally:
        release.set()
        w.shutdown()


async def test_requests_take_turns_within_a_namespace_and_namespaces_take_turns() -> None:
    w = Workers(1)
    order: list[str] = []
    started, release, block = _blocker()

    async def calls(ns: str, name: str, n: int) -> None:
        wk.TENANT.set(ns)  # this task's context only
        await asyncio.gather(*(w.submit(order.append, f"{name}{i}") for i in range(n)))

    try:
        held = asyncio.ensure_future(w.run(block))
        await _started(started)
        tasks = [asyncio.create_task(calls("a", "x", 3)), asyncio.create_task(calls("a", "y", 3)),
                 asyncio.create_task(calls("b", "z", 2))]
        await asyncio.sleep(0)
        release.set()
        await asyncio.wait_for(asyncio.gather(held, *tasks), WAIT)
        # Namespaces alternate (a, b, a, b, a, a ...); within a, x and y alternate.
        assert order == ["x0", "z0", "y0", "z1", "x1", "y1", "x2", "y2"], order
    finally:
        release.set()
        w.shutdown()


async def test_a_namespace_runs_at_most_its_share_of_the_threads() -> None:
    w = Workers(4, share=0.5)
    releases: list[threading.Event] = []
    running: list[str] = []
    lock = threading.Lock()

    def hold(name: str) -> None:
        ev = threading.Event()
        with lock:
            releases.append(ev)
            running.append(name)
        ev.wait(WAIT)

    async def flood() -> list[Any]:
        wk.TENANT.set("a")
        return await asyncio.gather(*(w.submit(hold, f"a{i}") for i in range(4)))

    try:
        a = asyncio.create_task(flood())
        await asyncio.sleep(0.2)
        assert w.running == 2 and w.queued() == 2  # a's share of 4 threads is 2
        wk.TENANT.set("b")
        b = asyncio.ensure_future(w.run(hold, "b"))
        for _ in range(100):
            if "b" in running:
                break
            await asyncio.sleep(0.02)
        assert "b" in running and w.running == 3, running
        for _ in range(100):
            with lock:
                for ev in releases:
                    ev.set()
            if a.done() and b.done():
                break
            await asyncio.sleep(0.02)
        await asyncio.wait_for(asyncio.gather(a, b), WAIT)
        assert w.running == 0 and w.queued() == 0
    finally:
        for ev in releases:
            ev.set()
        w.shutdown()


async def test_a_cancelled_queued_call_never_runs() -> None:
    w = Workers(1)
    ran: list[int] = []
    started, release, block = _blocker()
    try:
        held = w.submit(block)
        await _started(started)
        fut = w.submit(ran.append, 1)
        fut.cancel()
        release.set()
        await held
        await w.run(ran.append, 2)
        assert ran == [2] and w.running == 0 and w.queued() == 0
    finally:
        release.set()
        w.shutdown()


def test_a_namespace_over_its_share_gets_429_while_others_still_get_slots() -> None:
    slots = CopySlots(CopyLimits(copies_per_pod=8, copies_per_node=8, namespace_share=0.5))
    contextvars.copy_context().run(_share, slots)


def _share(slots: CopySlots) -> None:
    with ExitStack() as held:
        for i in range(4):
            held.enter_context(slots.slot(f"pod-a{i}", "tenant-a"))
        with pytest.raises(StatusError) as err:
            held.enter_context(slots.slot("pod-a9", "tenant-a"))
        assert err.value.code == 429 and err.value.retry_after == 5
        assert "namespace 'tenant-a'" in err.value.message
        for i in range(4):  # tenant B still gets the other half
            held.enter_context(slots.slot(f"pod-b{i}", "tenant-b"))
        with pytest.raises(StatusError) as err:
            held.enter_context(slots.slot("pod-c", "tenant-c"))
        assert err.value.code == 429 and "on this node" in err.value.message
    assert slots.total == 0 and slots.per_namespace == {} and slots.per_pod == {}


def test_a_share_is_at_least_one_slot() -> None:
    assert CopyLimits(copies_per_node=1, namespace_share=0.5).namespace_slots() == 1
    assert CopyLimits(copies_per_node=8, namespace_share=1.0).namespace_slots() == 8


# One step: acquire (pod, namespace), release the i-th held slot normally, or cancel it
# (its with-block left by CancelledError).
_step = hs.one_of(hs.tuples(hs.just("acquire"), hs.integers(0, 5), hs.integers(0, 2)),
                  hs.tuples(hs.sampled_from(["release", "cancel"]), hs.integers(0, 30),
                            hs.just(0)))


@settings(max_examples=300, deadline=None)
@given(steps=hs.lists(_step, max_size=60), per_pod=hs.integers(1, 4),
       per_node=hs.integers(1, 10), share=hs.sampled_from([0.25, 0.5, 0.75, 1.0]))
def test_slot_accounting_under_random_acquire_release_cancel(
        steps: list[tuple[str, int, int]], per_pod: int, per_node: int, share: float) -> None:
    # Slots set the worker tenant in the caller's context: keep it out of later tests.
    contextvars.copy_context().run(_random_slots, steps, per_pod, per_node, share)


def _random_slots(steps: list[tuple[str, int, int]], per_pod: int, per_node: int,
                  share: float) -> None:
    lim = CopyLimits(copies_per_pod=per_pod, copies_per_node=per_node, namespace_share=share)
    slots = CopySlots(lim)
    held: list[tuple[ExitStack, str, str]] = []
    for op, a, b in steps:
        if op == "acquire":
            pod, ns = f"p{a}", f"n{b}"
            st = ExitStack()
            room = (sum(1 for _, p, _ in held if p == pod) < per_pod
                    and sum(1 for _, _, n in held if n == ns) < lim.namespace_slots()
                    and len(held) < per_node)
            try:
                st.enter_context(slots.slot(pod, ns))
            except StatusError as exc:
                assert exc.code == 429 and not room
                continue
            assert room
            held.append((st, pod, ns))
        elif held:
            st, _, _ = held.pop(a % len(held))
            if op == "cancel":
                with pytest.raises(asyncio.CancelledError):
                    with st:
                        raise asyncio.CancelledError
            else:
                st.close()
        assert slots.total == len(held) <= per_node
        assert all(v <= lim.namespace_slots() for v in slots.per_namespace.values())
        assert all(v <= per_pod for v in slots.per_pod.values())
        assert sum(slots.per_namespace.values()) == sum(slots.per_pod.values()) == len(held)
    for st, _, _ in reversed(held):
        st.close()
    assert slots.total == 0 and slots.per_pod == {} and slots.per_namespace == {}


@settings(max_examples=40, deadline=None)
@given(copies=hs.lists(hs.tuples(hs.integers(0, 2), hs.integers(0, 4), hs.booleans()),
                       min_size=1, max_size=12))
def test_slots_and_worker_queues_drain_when_copies_are_cancelled(
        copies: list[tuple[int, int, bool]]) -> None:
    """Copies (namespace, calls, cancelled?) hold a slot and queue worker calls; some are
    cancelled mid-way. Afterwards no slot is held and no call is queued or running."""

    async def scenario() -> None:
        slots = CopySlots(CopyLimits(copies_per_pod=2, copies_per_node=4,
                                     namespace_share=0.5))
        w = Workers(2, share=0.5)
        gate = threading.Event()

        async def copy(i: int, ns: int, calls: int) -> None:
            with slots.slot(f"pod{i % 3}", f"ns{ns}"):
                await asyncio.gather(*(w.submit(gate.wait, 1.0) for _ in range(calls)))

        tasks = [asyncio.create_task(copy(i, ns, n)) for i, (ns, n, _) in enumerate(copies)]
        await asyncio.sleep(0)
        for t, (_, _, cancel) in zip(tasks, copies, strict=True):
            if cancel:
                t.cancel()
        gate.set()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            assert r is None or isinstance(r, (asyncio.CancelledError, StatusError)), r
        for _ in range(200):  # a cancelled copy's running call still finishes in its thread
            if w.running == 0:
                break
            await asyncio.sleep(0.01)
        assert slots.total == 0 and slots.per_namespace == {} and slots.per_pod == {}
        assert w.running == 0 and w.running_by == {} and w.queued() == 0 and w.queues == {}
        w.shutdown()

    asyncio.run(scenario())


def test_flags_set_the_share_and_the_minimum_rate() -> None:
    base = ["--node-name", "n", "--certs-dir", "/x"]
    c = from_args(base).copy
    assert (c.namespace_share, c.min_rate, c.rate_window) == (0.5, 1024, 30.0)
    c = from_args([*base, "--copy-namespace-share", "0.25", "--copy-min-rate", "2Ki",
                   "--copy-rate-window", "10"]).copy
    assert (c.namespace_share, c.min_rate, c.rate_window) == (0.25, 2048, 10.0)
    for bad in ("0", "1.5", "-1"):
        with pytest.raises(SystemExit):
            from_args([*base, "--copy-namespace-share", bad])
