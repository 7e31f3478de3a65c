"""The collection store's resourceVersions: a watcher at any version it hands out
replays to exactly the current state; versions older than its history are 410."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections.store import EPOCH_SHIFT, Clock, Collection, Event, parse_rv
from aggapi.status import StatusError

# (key, value): value None deletes
OPS = st.lists(st.tuples(st.sampled_from("abcd"), st.one_of(st.none(), st.integers(0, 3))),
               max_size=40)


def _apply(state: dict[str, int], col: Collection, key: str, value: int | None) -> None:
    col.set(key, None if value is None else {"metadata": {"name": key}, "v": value})
    if value is None:
        state.pop(key, None)
    else:
        state[key] = value


@settings(derandomize=True, database=None, max_examples=200)
@given(OPS, OPS, st.integers(4, 64))
def test_replay_from_any_version_reaches_the_current_state(
        before: list[tuple[str, int | None]], after: list[tuple[str, int | None]],
        history: int) -> None:
    col = Collection(Clock(), history=history)
    state: dict[str, int] = {}
    for k, v in before:
        _apply(state, col, k, v)
    seen, rv = dict(state), col.rv
    for k, v in after:
        _apply(state, col, k, v)
    try:
        events = col.since(rv)
    except StatusError as err:
        assert err.code == 410 and len(after) > 0
        return
    for ev in events:
        if ev.type == "DELETED":
            assert ev.obj["metadata"]["name"] in seen
            del seen[ev.obj["metadata"]["name"]]
        else:
            assert (ev.type == "ADDED") == (ev.obj["metadata"]["name"] not in seen)
            seen[ev.obj["metadata"]["name"]] = ev.obj["v"]
    assert seen == state
    assert [e.rv for e in events] == sorted({e.rv for e in events})
    assert all(int(o["metadata"]["resourceVersion"]) <= col.rv for o in col.objects.values())


@settings(derandomize=True, database=None, max_examples=200)
@given(OPS, OPS, st.integers(1, 4), st.sampled_from([None, 0, 1, 2]))
def test_past_the_history_a_kept_list_state_gives_the_net_change_of_each_object(
        before: list[tuple[str, int | None]], after: list[tuple[str, int | None]],
        history: int, wanted: int | None) -> None:
    """A watcher that listed (in pages: the state kept) at rv, and whose version the
    history no longer holds, gets each object's net change since: its cache ends equal
    to the current state, for any selector (``wanted``: only v == wanted match)."""
    def matches(v: int | None) -> bool:
        return v is not None and (wanted is None or v == wanted)

    col = Collection(Clock(), history=history)
    state: dict[str, int] = {}
    for k, v in before:
        _apply(state, col, k, v)
    rv = col.rv
    col.keep_state(rv, col.objects)
    seen = {k: v for k, v in state.items() if matches(v)}  # the watcher's list
    for k, v in after:
        _apply(state, col, k, v)
    events, at = col.net_since(rv)
    assert at == col.rv
    assert [e.rv for e in events] == sorted(e.rv for e in events)
    assert len({e.key for e in events}) == len(events)  # one per changed object
    for ev in events:
        name = ev.obj["metadata"]["name"]
        was = ev.prev is not None and matches(ev.prev["v"])
        now = ev.type != "DELETED" and matches(ev.obj["v"])
        if now:
            assert (name in seen) == was
            seen[name] = ev.obj["v"]
        elif was:
            del seen[name]
    assert seen == {k: v for k, v in state.items() if matches(v)}
    col.close()
    with pytest.raises(StatusError) as err:
        col.net_since(rv)  # another term: nothing kept
    assert err.value.code == 410


def test_past_the_history_without_a_kept_state_is_410() -> None:
    col = Collection(Clock(), history=2)
    col.set("a", {"metadata": {"name": "a"}, "v": 1})
    rv = col.rv
    for v in range(5):
        col.set("a", {"metadata": {"name": "a"}, "v": v + 2})
    with pytest.raises(StatusError) as err:
        col.net_since(rv)
    assert err.value.code == 410 and not col.owns(rv)


def test_a_later_terms_versions_are_above_the_earlier_ones() -> None:
    old = Clock(7)
    got = [old.next() for _ in range(1000)]
    assert got == sorted(set(got)) and got[0] == (7 << EPOCH_SHIFT) + 1
    assert Clock(8).next() > got[-1]


def test_older_than_the_collection_or_its_history_is_410() -> None:
    col = Collection(Clock(), history=2)
    with pytest.raises(StatusError) as err:
        col.since(col.start_rv - 1)
    assert err.value.code == 410 and err.value.reason == "Expired"
    first = col.rv
    for v in range(3):
        col.set("a", {"metadata": {"name": "a"}, "v": v})
    with pytest.raises(StatusError):
        col.since(first)  # the first change fell out of the history
    assert len(col.since(col.rv - 1)) <= 1


def test_unchanged_objects_make_no_event() -> None:
    col = Collection(Clock())
    assert col.set("a", {"metadata": {"name": "a"}, "v": 1}) is not None
    assert col.set("a", {"metadata": {"name": "a"}, "v": 1}) is None


@pytest.mark.parametrize("raw", ["x", "-1", "1.5", "12a"])
def test_unparsable_version_is_400(raw: str) -> None:
    with pytest.raises(StatusError) as err:
        parse_rv(raw)
    assert err.value.code == 400
    assert parse_rv("") is None and parse_rv("0") is None and parse_rv("17") == 17


def test_only_versions_this_collection_handed_out_are_served() -> None:
    """A version names one point of one history: another collection's on the same
    clock (the namespace's feed and the cluster-wide one stamp the same change
    differently), an earlier term's, or one this collection has not reached are not
    "everything after V" here."""
    clock = Clock(5)
    ns, everything = Collection(clock), Collection(clock)
    ns.set("a", {"metadata": {"name": "a"}})
    everything.set("a", {"metadata": {"name": "a"}})
    assert ns.owns(ns.rv) and not everything.owns(ns.rv)
    with pytest.raises(StatusError) as err:
        everything.since(ns.rv)
    assert err.value.code == 410
    later = Collection(Clock(6))
    assert not later.owns(ns.rv) and later.reached(ns.rv)  # the past: 410
    assert not ns.reached(later.rv)  # a later term's: from the future here
    ns.close()
    with pytest.raises(StatusError):
        ns.since(ns.rv)  # a closed term: every watcher relists


async def test_a_version_from_the_future_waits_then_is_504() -> None:
    col = Collection(Clock(5))
    ahead = col.rv + 1
    waiting = asyncio.ensure_future(col.wait_reached(ahead, 5.0))
    await asyncio.sleep(0)
    col.set("a", {"metadata": {"name": "a"}})
    await waiting  # reached by the next change
    with pytest.raises(StatusError) as err:
        await col.wait_reached(col.rv + 1, 0.01)
    assert err.value.code == 504 and err.value.reason == "Timeout"


def test_the_history_is_bounded_in_bytes_not_only_in_events() -> None:
    """Whoever may edit a pod can give it large labels, which its object copies: 64
    changes of a pod with 1 MiB of labels must not all stay in the history (4,096
    of them would be 4 GiB)."""
    import json
    labels = {f"k{i:05}": "v" * 56 for i in range(16_384)}  # 1 MiB as JSON
    col = Collection(Clock())
    first = col.rv
    for v in range(64):
        col.set("a", {"metadata": {"name": "a", "labels": labels}, "v": v})
    held = sum(len(json.dumps(ev.obj)) for ev in col._history)
    assert held < 48 * 2**20, f"{held / 2**20:.0f} MiB of events held"
    with pytest.raises(StatusError) as err:
        col.since(first)  # the oldest changes are gone: 410, the watcher relists
    assert err.value.code == 410
    assert [ev.obj["v"] for ev in col.since(col.rv - 1)] == [63]  # the newest stays
    small = Collection(Clock(), history=8)
    for v in range(20):
        small.set("a", {"metadata": {"name": "a"}, "v": v})
    assert len(small._history) == 8  # and in events, as before


def _held(ev: Event) -> int:
    """What an event holds, as the bound means it: its object's Python estimate and
    every encoded bytes it keeps (whatever attribute keeps them)."""
    import gc
    import json

    from aggapi.apiserver.collections.histbound import PYTHON_PER_JSON_BYTE
    seen, todo, raw = set(), list(gc.get_referents(ev)), 0
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, bytes):
            raw += len(o)
        elif isinstance(o, dict) and not {"metadata", "kind"} & set(o):
            todo.extend(gc.get_referents(o))  # an Event's own containers, not objects
    obj = ev.obj
    return PYTHON_PER_JSON_BYTE * len(json.dumps(obj, separators=(",", ":"))) + raw


async def test_the_byte_bound_counts_the_lines_sent_to_watchers() -> None:
    """The encoded lines every plain watcher sends are held with the history's events:
    the bound counts them, or a history at its bound holds a quarter more."""
    from aggapi.apiserver.collections.selectors import Selector
    from aggapi.apiserver.collections.watch import Encoder, _send_changes

    class Sink:
        async def write(self, data: bytes) -> None:
            pass
    plain = Encoder("PodImagePull", [], lambda o: [], None, "Metadata")
    bound = 4 * 2**20
    col = Collection(Clock(), history_bytes=bound)
    first = col.rv
    for v in range(200):
        labels = {f"k{i:04}": f"{v:04}" + "v" * 60 for i in range(512)}  # 36 KiB
        col.set("a", {"kind": "PodImagePull", "metadata": {"name": "a", "labels": labels},
                      "v": v})
        news = col.since(first) if v == 0 else col.since(col.rv - 1)
        await _send_changes(Sink(), news, Selector(), plain)  # type: ignore[arg-type]
    held = sum(_held(ev) for ev in col._history)
    biggest = max(_held(ev) for ev in col._history)
    assert held <= bound + biggest, f"{held / 2**20:.2f} MiB held, bound {bound / 2**20} MiB"


def test_an_unrecorded_change_expires_every_version_before_it() -> None:
    col = Collection(Clock(1))
    start = col.start_rv
    col.set("a", {"metadata": {"name": "a"}, "v": 0})
    before = col.rv
    col.set("b", {"metadata": {"name": "b"}, "v": 0}, record=False)
    built = col.rv
    assert col.start_rv == built  # the collection starts again from there
    for rv in (start, before):
        with pytest.raises(StatusError) as exc:
            col.since(rv)
        assert exc.value.code == 410
    assert col.since(built) == [] and set(col.objects) == {"a", "b"}
    col.set("a", None)  # recorded again from there on
    assert [(ev.type, ev.key) for ev in col.since(built)] == [("DELETED", "a")]


def test_an_unrecorded_changes_version_leaves_with_the_first_eviction() -> None:
    col = Collection(Clock(1), history=2)
    col.set("a", {"metadata": {"name": "a"}, "v": 0}, record=False)
    built = col.rv
    for v in range(3):
        col.set("b", {"metadata": {"name": "b"}, "v": v})
    assert not col.owns(built)


@settings(derandomize=True, database=None, max_examples=100)
@given(OPS, st.integers(4, 64), st.data())
def test_the_changes_after_a_version_are_the_historys_later_ones_first_first(
        ops: list[tuple[str, int | None]], history: int, data: st.DataObject) -> None:
    """since(rv, limit) (found by bisection, watch.py takes its catch-up that way) is
    the history's changes after rv, in order, the first ``limit`` of them."""
    col = Collection(Clock(), history=history)
    state: dict[str, int] = {}
    for k, v in ops:
        _apply(state, col, k, v)
    held = list(col._history)
    rvs = sorted({col.start_rv, *(e.rv for e in held)})
    rv = data.draw(st.sampled_from(rvs))
    limit = data.draw(st.none() | st.integers(1, 8))
    if not col.owns(rv):
        return
    want = [e for e in held if e.rv > rv]
    assert col.since(rv, limit) == (want if limit is None else want[:limit])
