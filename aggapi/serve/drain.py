"""Draining copies when a server is told to stop (SIGTERM): the agent's and the relay's.

Once :meth:`Drain.start` is called (with a deadline well before the pod's grace period
ends), a new copy is refused with a retryable 503 and each copy in flight is judged
every ``check_every`` seconds:

- an upload whose remaining body (its Content-Length less the bytes taken), at the
  rate it has come so far, arrives before the deadline goes on; one that cannot is ended
  at once with a retryable 503 (``Retry-After``), so its client stops sending into a
  process about to die and sends again to the server that replaces this one. Its
  handler is cancelled, as when a client goes away: the temp file goes, the target stays
  as it was (the publish is atomic);
- a copy whose size is unknown (a download: the client resumes it with ``Range`` from
  what came) runs until the deadline, and is cut then.

:meth:`Drain.idle` returns when no copy is left; the server then stops. The judging is
a pure function of the byte counts and a clock (:meth:`Drain.finishes`), for tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from aggapi.serve.unread import answer_unread
from aggapi.status import StatusError
from aggapi.wire import PARAM_PATH

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# How long an ended upload's connection stays open, unread, for its Status to reach the
# peer before the close (closing with unread data sends a reset, which can destroy the
# answer in flight).
ANSWER_LINGER = 0.5


@dataclass(eq=False)
class Transfer:
    """One copy in flight: how many bytes it must move (None: unknown), how many it has."""

    started: float
    total: int | None
    moved: Callable[[], int]
    label: str = ""
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # told to end early


class Drain:
    def __init__(self, *, retry_after: int = 1, check_every: float = 0.5,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.retry_after = retry_after
        self.check_every = check_every
        self.clock = clock
        self.transfers: set[Transfer] = set()
        self.deadline: float | None = None
        self.ended_early = 0  # copies this drain ended (metrics, tests)
        self._changed = asyncio.Event()
        self._watch: asyncio.Task[None] | None = None

    @property
    def draining(self) -> bool:
        return self.deadline is not None

    def finishes(self, t: Transfer, now: float) -> bool:
        """Whether ``t`` may go on: it can end before the deadline at its rate so far."""
        assert self.deadline is not None
        if now >= self.deadline:
            return False
        if t.total is None:
            return True  # unknown size (a download): until the deadline
        moved = t.moved()
        remaining = t.total - moved
        if remaining <= 0:
            return True  # all in: storing it (fsync, rename) until the deadline
        elapsed = now - t.started
        if moved <= 0 or elapsed <= 0:
            return False  # nothing came yet: no rate to hope on
        return now + remaining * elapsed / moved <= self.deadline

    def judge(self) -> list[Transfer]:
        """End the copies that cannot finish; those ended."""
        now = self.clock()
        out = [t for t in self.transfers if not t.ended.is_set() and not self.finishes(t, now)]
        for t in out:
            self.ended_early += 1
            t.ended.set()
        return out

    def start(self, seconds: float) -> None:
        """Refuse new copies, and end those in flight that cannot finish in ``seconds``."""
        if self.deadline is not None:
            return
        self.deadline = self.clock() + seconds
        log.info("draining copies", extra={"copies": len(self.transfers),
                                           "deadlineSeconds": seconds})
        self._watch = asyncio.create_task(self._judge_until_idle(), name="copy-drain")

    async def _judge_until_idle(self) -> None:
        while self.transfers:
            for t in self.judge():
                log.info("copy ended by the drain", extra={"target": t.label})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.check_every)
            self._changed.clear()

    async def idle(self) -> None:
        """Wait until no copy is in flight (those that cannot finish are ended)."""
        if self._watch is not None:
            await self._watch

    async def run(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Serve one copy under the drain: refused while draining, else tracked and ended
        early when the drain judges it cannot finish."""
        upload = request.method == "POST"
        if self.draining:
            err = StatusError(503, "this server is shutting down: retry the copy, it will "
                                   "reach another", retry_after=self.retry_after)
            if upload and not request.content.is_eof():
                return await self._answer(request, err)  # not after taking its body
            raise err
        content = request.content
        t = Transfer(self.clock(), request.content_length if upload else None,
                     (lambda: content.total_bytes) if upload else (lambda: 0),
                     request.query.get(PARAM_PATH, request.path))
        inner = asyncio.ensure_future(handler(request))
        ended = asyncio.ensure_future(t.ended.wait())
        self.transfers.add(t)
        try:
            await asyncio.wait((inner, ended), return_when=asyncio.FIRST_COMPLETED)
            if inner.done():
                return inner.result()
            inner.cancel()
            with contextlib.suppress(BaseException):  # its own end is not the answer
                await inner
            return await self._ended(request, upload)
        finally:
            ended.cancel()
            if not inner.done():  # this task was cancelled (its client went away)
                inner.cancel()
                with contextlib.suppress(BaseException):
                    await inner
            self.transfers.discard(t)
            self._changed.set()

    async def _ended(self, request: web.Request, upload: bool) -> web.StreamResponse:
        transport = request.transport
        if not upload or request.writer.output_size:
            # A response is under way (or a download's client resumes what came): cut.
            if transport is not None:
                transport.abort()
            raise ConnectionResetError("copy ended by the drain")
        return await self._answer(request, StatusError(
            503, "this server is shutting down and the copy could not finish before it "
                 "stops: send it again, it will reach another",
            retry_after=self.retry_after))

    async def _answer(self, request: web.Request, err: StatusError) -> web.StreamResponse:
        """Answer ``err`` to an upload whose body is not all read, read no more of it,
        and close the connection."""
        return await answer_unread(request, err, ANSWER_LINGER)
