"""One shared poller per node, fanned out to any number of subscribers.

The poller runs only while someone subscribes, polls the backend every
``interval`` for the union of the images subscribers watch, and publishes the
latest NodeState. Subscribers read the latest state when they are ready: a slow
one skips intermediate states (coalesced), nothing queues, so memory does not
grow with slowness, and backend calls do not grow with the subscriber count.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

from aggapi import tasks
from aggapi.agent.progress.model import NodeState

log = logging.getLogger(__name__)


class Backend(Protocol):
    name: str

    async def observe(self, watched: Iterable[str]) -> NodeState: ...

    async def present_images(self) -> tuple[str, ...] | None:
        """The image references on the node; None when the backend cannot list them."""

    def forget(self) -> None:
        """Drop per-image memory (pull history) kept between observations."""


class Subscription:
    def __init__(self, poller: ProgressPoller, images: frozenset[str],
                 internal: bool = False) -> None:
        self.poller = poller
        self.images = images
        self.internal = internal
        self._seen = 0
        self.closed = False

    async def next(self, max_wait: float | None = None) -> NodeState | None:
        """The latest state newer than the last one returned; None on timeout."""
        loop = asyncio.get_running_loop()
        deadline = None if max_wait is None else loop.time() + max_wait
        while True:
            state = self.poller.state
            # A state from before our images were watched tells us nothing yet.
            if (self.poller.version > self._seen and state is not None
                    and (state.error or self.images <= state.images.keys())):
                self._seen = self.poller.version
                return state
            changed = self.poller._changed  # capture: the poller swaps it on publish
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return None
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.poller._unsubscribe(self)

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class ProgressPoller:
    def __init__(self, backend: Backend, interval: float = 0.25, *,
                 failures_before_error: int = 4,
                 on_poll: Callable[[float], None] | None = None) -> None:
        self.backend = backend
        self.on_poll = on_poll  # gets each poll's duration in seconds (metrics)
        self.interval = interval
        self.failures_before_error = failures_before_error
        self.state: NodeState | None = None
        self.version = 0
        self.polls = 0
        self.last_poll_seconds = 0.0
        self._changed = asyncio.Event()
        self._interest: Counter[str] = Counter()
        self._subscribers = 0
        self._internal = 0  # subscriptions of the agent itself (pull metrics), not streams
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()  # the backend keeps memory: one observe at a time

    @property
    def subscribers(self) -> int:
        """Open streams (the agent's own subscriptions are not counted)."""
        return self._subscribers - self._internal

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def watched(self) -> frozenset[str]:
        return frozenset(self._interest)

    def subscribe(self, images: Iterable[str], *, internal: bool = False) -> Subscription:
        """``internal``: the agent's own (it keeps the poller running; not a stream)."""
        sub = Subscription(self, frozenset(images), internal)
        self._interest.update(sub.images)
        self._subscribers += 1
        self._internal += internal
        if not self.running:
            self._task = asyncio.create_task(self._run(), name="progress-poller")
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        self._interest.subtract(sub.images)
        self._interest = +self._interest  # drop zero counts
        self._subscribers -= 1
        self._internal -= sub.internal
        if self._subscribers == 0 and self._task is not None:
            self._task.cancel()
            self._task = None
            # Nobody watches the node now: what we saw goes stale (an image may be
            # removed and pulled again meanwhile). The next subscriber waits for a poll,
            # and the backend starts without the last pull's history.
            self.state = None
            self.backend.forget()

    async def observe_once(self, images: Iterable[str] = ()) -> NodeState:
        """One poll for a one-shot request; when the poller is running and already
        watches these images, its latest state serves instead of another poll."""
        want = frozenset(images)
        if self.running and self.state is not None and want <= self.watched():
            return self.state
        async with self._lock:
            state = await self.backend.observe(want | self.watched())
            if not self.running:
                self.backend.forget()  # a one-shot answer leaves no history behind
            return state

    async def close(self) -> None:
        await tasks.cancel(self._task)
        self._task = None

    def _publish(self, state: NodeState) -> None:
        if state == self.state:  # time is not compared: nothing new to tell
            self.state = state
            return
        self.state = state
        self.version += 1
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    async def _run(self) -> None:
        failures = 0
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            started = time.perf_counter()
            try:
                async with self._lock:
                    state = await self.backend.observe(self.watched())
                failures = 0
                self._publish(state)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the runtime may be restarting: retry, report later
                failures += 1
                log.warning("progress poll failed (%d in a row): %s", failures, err)
                if failures >= self.failures_before_error:
                    old = self.state
                    self._publish(NodeState(self.backend.name,
                                            dict(old.images) if old else {}, None,
                                            error=f"cannot read the container runtime: {err}",
                                            time=time.time()))
            self.polls += 1
            self.last_poll_seconds = time.perf_counter() - started
            if self.on_poll is not None:
                self.on_poll(self.last_poll_seconds)
            # Fixed cadence, but never two polls back to back if one ran long.
            next_at = max(next_at + self.interval, loop.time() + self.interval / 4)
            await asyncio.sleep(next_at - loop.time())
