"""aggapi.client.retry.Backoff: a server being replaced (503 + Retry-After, as a draining
agent or apiserver answers, and then "no ready agent" until its successor is Ready) is
waited out with the default retries; other failures still spend attempts (issue 35)."""

from __future__ import annotations

from aggapi.client.errors import InternalError, ServiceUnavailable
from aggapi.client.retry import Backoff


def _unavailable(retry_after: float | None = 5) -> ServiceUnavailable:
    return ServiceUnavailable({"kind": "Status", "code": 503,
                               "message": "no ready aggapi agent on node"}, retry_after)


def test_an_agent_roll_of_a_minute_is_waited_out_by_default() -> None:
    b = Backoff()
    waits = [b.next_delay(_unavailable()) for _ in range(12)]  # 60 s of a roll
    assert waits == [5.0] * 12
    assert b.failures == 0  # no attempt spent: a real failure still gets all of them
    assert b.next_delay(InternalError.from_message("boom")) is None  # 500: not retryable


def test_the_wait_for_a_roll_is_bounded() -> None:
    b = Backoff(attempts=2)
    assert sum(b.next_delay(_unavailable()) or 0 for _ in range(18)) == 90.0
    # Past the budget, 503s spend attempts as any failure does.
    assert b.next_delay(_unavailable()) is not None
    assert b.next_delay(_unavailable()) is not None
    assert b.next_delay(_unavailable()) is None


def test_no_retries_means_none_and_progress_renews_the_budget() -> None:
    assert Backoff(attempts=0).next_delay(_unavailable()) is None
    b = Backoff(unavailable_budget=10)
    assert [b.next_delay(_unavailable()) for _ in range(2)] == [5.0, 5.0]
    b.progressed()
    assert b.unavailable_waited == 0
    # A 503 without Retry-After is an ordinary failure.
    assert Backoff().next_delay(_unavailable(None)) == 0.2
