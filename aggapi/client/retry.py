"""Backoff for reconnecting streams: what may be retried, and how long to wait."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from aggapi.client.errors import RETRYABLE, AggapiError, ServiceUnavailable, TransferError

log = logging.getLogger(__name__)

# Transport failures: a cut connection, a reset, a stalled read, a truncated body.
TRANSIENT: tuple[type[BaseException], ...] = (
    aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, aiohttp.ClientResponseError,
    asyncio.TimeoutError, ConnectionError, asyncio.IncompleteReadError, TransferError,
)

# What a retry loop catches, then asks Backoff whether to go on.
CATCH: tuple[type[BaseException], ...] = (AggapiError, *TRANSIENT)


@dataclass
class Backoff:
    """Exponential backoff that resets once a connection made progress.

    A 503 with Retry-After is a server being replaced (an agent or apiserver pod rolling:
    it drains, refuses new copies, and its successor takes a few seconds to be Ready).
    Those answers are waited out, as asked, for up to ``unavailable_budget`` seconds in
    all without spending ``attempts``: a roll needs no ``--retries`` from the user."""

    attempts: int = 8
    first: float = 0.2
    cap: float = 5.0
    failures: int = 0
    unavailable_budget: float = 90.0
    unavailable_waited: float = 0.0

    def retryable(self, exc: BaseException) -> bool:
        if isinstance(exc, AggapiError) and not isinstance(exc, TransferError):
            return isinstance(exc, RETRYABLE)
        return isinstance(exc, TRANSIENT)

    def next_delay(self, exc: BaseException) -> float | None:
        """Seconds to wait before the next try, or None when giving up."""
        ra = getattr(exc, "retry_after", None)
        if (isinstance(exc, ServiceUnavailable) and isinstance(ra, int | float)
                and self.attempts > 0):
            delay = min(max(float(ra), self.first), self.cap)
            if self.unavailable_waited + delay <= self.unavailable_budget:
                self.unavailable_waited += delay
                return delay
        self.failures += 1
        if self.failures > self.attempts or not self.retryable(exc):
            return None
        delay = min(self.cap, self.first * 2 ** (self.failures - 1))
        if isinstance(ra, int | float):
            delay = min(max(delay, float(ra)), 60.0)
        return delay

    def progressed(self) -> None:
        self.failures = 0
        self.unavailable_waited = 0.0


def as_error(exc: BaseException) -> AggapiError:
    """Out of retries: a transport failure leaves as a typed TransferError too."""
    if isinstance(exc, AggapiError):
        return exc
    text = str(exc) or type(exc).__name__
    return TransferError.from_message(f"connection to the API server failed: {text}")


async def wait_or_raise(backoff: Backoff, exc: BaseException,
                        on_retry: Callable[[BaseException, float], None] | None = None
                        ) -> None:
    """Sleep before the next try of what failed with ``exc``; out of retries (or not
    retryable), raise it as an AggapiError."""
    delay = backoff.next_delay(exc)
    if delay is None:
        err = as_error(exc)
        if err is exc:
            raise exc
        raise err from exc
    log.info("retrying in %.1fs after: %s", delay, str(exc) or type(exc).__name__)
    if on_retry is not None:
        on_retry(exc, delay)
    await asyncio.sleep(delay)
