"""The collection store's resourceVersions: a watcher at any version it hands out
replays to exactly the current state; versions older than its history are 410."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.apiserver.collections.store import STARTED_WITHIN_US, Clock, Collection, parse_rv
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


def test_versions_never_repeat_or_go_back() -> None:
    times = iter([5.0, 5.0, 4.0, 6.0])
    clock = Clock(lambda: next(times))
    got = [clock.next() for _ in range(4)]
    assert got == [5_000_000, 5_000_001, 5_000_002, 6_000_000]


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


def test_a_lists_version_is_taken_by_a_collection_started_after_the_last_change() -> None:
    """Two replicas, one clock each in real life (wall time): the list comes from one
    whose last change is old, the watch goes to one whose collection started since.
    The list's version is the state as it is now, so the watch is served, not 410."""
    t = [100.0]
    clock = Clock(now=lambda: t[0])
    idle = Collection(clock)
    idle.set("a", {"metadata": {"name": "a"}})
    last_change = idle.rv
    t[0] += 30  # idle for a while; the other replica's feed starts afresh
    young = Collection(clock)
    t[0] += 1
    listed = idle.now_rv()
    assert listed > young.start_rv > last_change
    young.check_rv(listed)  # served
    assert young.since(listed) == []
    with pytest.raises(StatusError) as err:
        young.check_rv(last_change)  # what a list handed out before
    assert err.value.code == 410
    # the list's version is the state's: a change after it is after it
    ev = idle.set("a", {"metadata": {"name": "a"}, "x": 1})
    assert ev is not None and ev.rv > listed and idle.since(listed) == [ev]


def test_a_version_from_just_before_the_collection_started_is_served_from_its_state() -> None:
    """kubectl get -w lists on one replica and watches on the other, whose feed starts
    for that watch: a version from moments before it started is served (the state as
    events); an older one, or one the history no longer covers, is still 410."""
    t = [100.0]
    col = Collection(Clock(now=lambda: t[0]), history=3)
    assert col.started_after(col.start_rv - 1)
    assert col.started_after(col.start_rv - STARTED_WITHIN_US)
    assert not col.started_after(col.start_rv - STARTED_WITHIN_US - 1)
    assert not col.started_after(col.start_rv)  # not before it: the history serves it
    for v in range(3):
        col.set("a", {"metadata": {"name": "a"}, "v": v})
    assert not col.started_after(col.start_rv - 1)  # changes may be lost: 410


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
