"""aggapi.fs.pump: every byte reaches the writer once, in order, in batches, with at most
one write in flight; a failed read keeps what was received only when asked to."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.fs.pump import pump


class Writer:
    def __init__(self, fail_at: int | None = None) -> None:
        self.batches: list[list[bytes]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.fail_at = fail_at

    def start(self, pieces: list[bytes]) -> asyncio.Future[None]:
        return asyncio.ensure_future(self._write(pieces))

    async def _write(self, pieces: list[bytes]) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1
        if self.fail_at is not None and len(self.batches) == self.fail_at:
            raise OSError("disk full")
        self.batches.append(pieces)

    @property
    def data(self) -> bytes:
        return b"".join(b"".join(p) for p in self.batches)


def reader(pieces: list[bytes], fail_after: int | None = None
           ) -> Callable[[int], Awaitable[bytes]]:
    it = iter(pieces)
    count = 0

    async def read(n: int) -> bytes:
        nonlocal count
        await asyncio.sleep(0)
        if fail_after is not None and count == fail_after:
            raise ConnectionResetError("cut")
        count += 1
        return next(it, b"")

    return read


pieces_st = st.lists(st.binary(min_size=1, max_size=300), max_size=40)


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_st, batch=st.integers(1, 1000))
def test_every_byte_once_in_order_in_batches(pieces: list[bytes], batch: int) -> None:
    w = Writer()
    asyncio.run(pump(reader(pieces), w.start, batch=batch))
    assert w.data == b"".join(pieces)
    assert all(sum(map(len, b)) >= batch for b in w.batches[:-1])
    assert w.most_in_flight <= 1


@settings(max_examples=200, deadline=None)
@given(pieces=pieces_st, batch=st.integers(1, 1000), cut=st.integers(0, 40),
       keep=st.booleans())
def test_a_cut_keeps_what_arrived_only_when_asked(pieces: list[bytes], batch: int, cut: int,
                                                  keep: bool) -> None:
    cut = min(cut, len(pieces))
    w = Writer()
    with pytest.raises(ConnectionResetError):
        asyncio.run(pump(reader([*pieces, b"never"], fail_after=cut), w.start, batch=batch,
                         keep_received=keep))
    received = b"".join(pieces[:cut])
    if keep:
        assert w.data == received
    else:
        assert received.startswith(w.data)
        assert len(received) - len(w.data) < batch + 300  # at most the batch being built


def test_a_failed_write_fails_the_pump_and_checks_run_before_each_batch() -> None:
    checks = []
    w = Writer(fail_at=1)
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(pump(reader([b"a" * 10] * 5), w.start, batch=10,
                         before=lambda: checks.append(len(w.batches))))
    assert w.batches == [[b"a" * 10]]
    assert len(checks) >= 2


def test_a_failing_check_stops_before_the_handover() -> None:
    def dead() -> None:
        raise ProcessLookupError("container exited")

    w = Writer()
    with pytest.raises(ProcessLookupError):
        asyncio.run(pump(reader([b"x" * 100]), w.start, batch=10, before=dead))
    assert w.batches == []
