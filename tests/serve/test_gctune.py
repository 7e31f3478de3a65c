"""The apiserver process's collector settings (aggapi.serve.gctune)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from aggapi.serve import gctune


@pytest.fixture
def restore_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_young_collections_come_after_many_more_allocations(restore_gc: None) -> None:
    gc.set_threshold(700, 10, 10)
    gctune.tune()
    assert gc.get_threshold() == (gctune.GEN0, 10, 10)
    gc.set_threshold(10 * gctune.GEN0, 10, 10)  # never lowered
    gctune.tune()
    assert gc.get_threshold()[0] == 10 * gctune.GEN0


def test_freeze_collects_the_garbage_first_then_freezes_what_lives(restore_gc: None) -> None:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a  # a cycle, garbage once dropped
    gone = weakref.ref(a)
    del a, b
    kept = {"pods": [{"metadata": {"name": f"p{i}"}} for i in range(100)]}
    gctune.freeze()
    assert gone() is None  # collected, not frozen
    assert gc.get_freeze_count() > 0 and gc.is_tracked(kept)


def test_a_later_freeze_collects_only_the_young_generations(
        restore_gc: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first freeze scans everything; a later one (a new term's build, a mirror's
    sync) only what is young: a full collection over a million objects held a new
    leader's loop for seconds. A young cycle is still collected, not frozen."""
    gc.unfreeze()
    generations: list[int] = []
    collect = gc.collect

    def recorded(generation: int = 2) -> int:
        generations.append(generation)
        return collect(generation)
    monkeypatch.setattr(gc, "collect", recorded)
    gctune.freeze()

    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gctune.freeze()
    assert generations == [2, 1] and gone() is None
