"""Dirty keys rebuilt together a moment after the first change (the feeds' batching,
``feeds.py``): a burst of events (a rollout) costs one rebuild per key, not one per
event."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

FLUSH_DELAY = 0.05  # seconds: changes within it are rebuilt together
# Pods rebuilt per turn of the event loop (about 150 us each): a relist of 10,000 pods
# would otherwise hold every request and watch for a second and more.
FLUSH_BATCH = 100


class Batcher:
    """Dirty keys, rebuilt together FLUSH_DELAY after the first change: kube's changes
    (``urgent``: phases, new and gone pods) before those of the nodes' views (bytes),
    each in the order marked. In a rollout thousands of pods wait for new bytes at
    once; a Pulled pod taken from a set in any order waited behind them for seconds."""

    def __init__(self) -> None:
        self.urgent: OrderedDict[Any, None] = OrderedDict()
        self.dirty: OrderedDict[Any, None] = OrderedDict()
        self.everything = False
        self._timer: asyncio.TimerHandle | None = None

    def mark(self, keys: Iterable[Any] | None, *, urgent: bool = False) -> None:
        if keys is None:
            self.everything = True
        else:
            into = self.urgent if urgent else self.dirty
            for key in keys:
                into[key] = None
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.flush()

    @property
    def pending(self) -> bool:
        return bool(self.urgent or self.dirty or self.everything)

    def take(self, limit: int | None = None, *, urgent_only: bool = False
             ) -> tuple[set[Any], bool]:
        """The keys to rebuild now, at most ``limit`` (urgent first, oldest first; the
        rest stay marked), and whether everything was marked."""
        everything, self.everything = self.everything, False
        if urgent_only:
            keys = set(self.urgent)
            self.urgent = OrderedDict()
            return keys, everything
        if limit is None or len(self.urgent) + len(self.dirty) <= limit:
            keys = set(self.urgent) | set(self.dirty)
            self.urgent, self.dirty = OrderedDict(), OrderedDict()
            return keys, everything
        keys = set()
        for marked in (self.urgent, self.dirty):
            while marked and len(keys) < limit:
                keys.add(marked.popitem(last=False)[0])
        return keys, everything

    def flush(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
