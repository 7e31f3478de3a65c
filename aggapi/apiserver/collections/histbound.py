"""A watch history bounded in bytes as well as in events.

A count alone does not bound memory: each event keeps its object, and a pod's object
carries the pod's labels, which whoever may edit the pod can make large (up to about
1.5 MiB a pod, etcd's request limit). 4,096 such events would be gigabytes. So
each event is weighed when it enters (an estimate of the Python objects it holds,
from the length of its JSON, plus that JSON itself, which it keeps for every plain
watcher to send) and the oldest leave while the total is over ``max_bytes`` or the
count over ``max_events``. The newest event always stays. A
watcher whose position left the history gets 410 and relists, as after any eviction.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

# The bytes bound binds first for typical objects (about 9,600 PodImagePulls of 700
# bytes: 6 s of a 50,000-pod rollout's changes, against 2.7 s when 4,096 events bound
# it; a follower's mirror that fell out there resynced 50,000 objects from a busy
# leader, and could not succeed it). kube-apiserver's watch cache sizes itself to
# keep 75 s of changes; the count bound here only caps tiny objects.
HISTORY_EVENTS = 16384
HISTORY_BYTES = 32 * 1024 * 1024  # estimated, per collection
# Python's objects for parsed JSON take 2.6 (large flat maps, as labels) to 5.5 (small
# nested objects) times its text (measured with tracemalloc); strings a stored object
# shares with the pod it came from make it less.
PYTHON_PER_JSON_BYTE = 4

E = TypeVar("E")


def encode(obj: Any) -> bytes:
    """``obj``'s compact JSON, as a watch line carries it (a C encoder: about 10 us
    for a typical PodImagePull)."""
    return json.dumps(obj, separators=(",", ":"), default=repr).encode()


def weight(text: bytes) -> int:
    """Bytes held by an object whose JSON is ``text``: its Python objects (estimated
    from the text's length, a third of the cost of walking them) and the text."""
    return (PYTHON_PER_JSON_BYTE + 1) * len(text)


class BoundedHistory(Generic[E]):
    """The events, oldest first; ``evicted`` once any has left."""

    def __init__(self, size: Callable[[E], int], *, max_events: int = HISTORY_EVENTS,
                 max_bytes: int = HISTORY_BYTES) -> None:
        self._size = size
        self.max_events, self.max_bytes = max_events, max_bytes
        self._events: deque[E] = deque()
        self._sizes: deque[int] = deque()
        self.bytes = 0
        self.evicted = False

    def append(self, ev: E) -> list[E]:
        """Add ``ev``; the oldest events it pushed out, oldest first."""
        n = self._size(ev)
        self._events.append(ev)
        self._sizes.append(n)
        self.bytes += n
        gone = []
        while len(self._events) > 1 and (len(self._events) > self.max_events
                                         or self.bytes > self.max_bytes):
            gone.append(self._events.popleft())
            self.bytes -= self._sizes.popleft()
            self.evicted = True
        return gone

    def clear(self) -> None:
        """Drop every event (each counts as evicted)."""
        self.evicted = self.evicted or bool(self._events)
        self._events.clear()
        self._sizes.clear()
        self.bytes = 0

    @property
    def full(self) -> bool:
        """Whether changes may have left it: some did, or its count is at the bound
        (as a full ``deque(maxlen=...)`` is taken)."""
        return self.evicted or len(self._events) >= self.max_events

    def __len__(self) -> int:
        return len(self._events)

    def __getitem__(self, i: int) -> E:
        return self._events[i]

    def __iter__(self) -> Iterator[E]:
        return iter(self._events)

    def __reversed__(self) -> Iterator[E]:
        return reversed(self._events)
