"""--copy-min-rate / --copy-rate-window (issue 24, finding 4): an upload that trickles
and a download nobody reads are cut once they move fewer than min_rate bytes/s over the
window, and their copy slot is freed; the idle timer alone reset on every piece."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from aggapi.agent.copy.pace import MinRate
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver, temp_leftovers

WINDOW = 1.0
RATE = 4096
MARGIN = 20.0  # far beyond WINDOW: only a copy that is never cut runs into it


@pytest.fixture
async def cc(plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> Any:
    # One slot per pod: a copy that kept its slot would refuse the next one.
    lim = dataclasses.replace(limits, copies_per_pod=1, min_rate=RATE, rate_window=WINDOW,
                              body_idle_timeout=MARGIN)
    return await serve(DirResolver(plain[0]), lim)


async def _slot_freed(cc: Any) -> float:
    start = time.monotonic()
    while cc.state.slots.total:
        assert time.monotonic() - start < MARGIN, "the slot is still held"
        await asyncio.sleep(0.05)
    return time.monotonic() - start


async def test_a_trickling_upload_is_cut_with_408_and_frees_its_slot(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "t").write_bytes(b"before")
    stop = asyncio.Event()

    async def trickle() -> AsyncIterator[bytes]:
        # 100 B every 0.1 s (1000 B/s < RATE), never idle: for MARGIN s at most.
        deadline = time.monotonic() + MARGIN
        while not stop.is_set() and time.monotonic() < deadline:
            yield b"s" * 100
            await asyncio.sleep(0.1)

    start = time.monotonic()
    try:
        r = await asyncio.wait_for(cc.post("/t", trickle()), MARGIN + 5)
        took = time.monotonic() - start
        status = await r.json()
    finally:
        stop.set()
    assert r.status == 408, status
    assert status["reason"] == "Timeout" and f"fewer than {RATE} bytes/s" in status["message"]
    assert took < WINDOW * 5, took
    assert (root / "t").read_bytes() == b"before" and temp_leftovers(root) == []
    await _slot_freed(cc)
    r = await asyncio.wait_for(cc.post("/t", b"after"), MARGIN)
    assert r.status == 200, await r.text()


async def test_a_download_nobody_reads_is_cut_and_frees_its_slot(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "big").write_bytes(b"")
    os.truncate(root / "big", 48 << 20)  # more than any socket buffers hold
    client = cc.client
    cap = cc._headers("copy.download", "/big", {}, None)
    query = urlencode({"container": "c", "path": "/big"})
    head = "".join(f"{k}: {v}\r\n" for k, v in cap.items())
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (client.host, client.port))
        await loop.sock_sendall(sock, (f"GET /v1/copy?{query} HTTP/1.1\r\nHost: x\r\n{head}"
                                       "\r\n").encode())
        for _ in range(200):  # the download starts and then waits on the full socket
            if cc.state.slots.total:
                break
            await asyncio.sleep(0.02)
        assert cc.state.slots.total == 1
        took = await _slot_freed(cc)  # never read: cut after about WINDOW s of waiting
        assert took < WINDOW * 5 + 2, took
    finally:
        sock.close()
    r = await asyncio.wait_for(cc.get("/big", headers={"Range": "bytes=0-9"}), MARGIN)
    assert r.status == 206 and await r.read() == b"\0" * 10


async def test_a_download_read_at_a_good_pace_is_not_cut(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    data = os.urandom(4 << 20)
    (root / "f").write_bytes(data)
    r = await cc.get("/f")
    got = bytearray()
    while chunk := await r.content.read(256 << 10):  # about 2.5 MiB/s, over 1.5 s
        got += chunk
        await asyncio.sleep(0.1)
    assert bytes(got) == data


_piece = hs.tuples(hs.integers(0, 1 << 16), hs.floats(0, 2.0))


@settings(max_examples=300, deadline=None)
@given(pieces=hs.lists(_piece, max_size=80), rate=hs.integers(1, 1 << 14),
       window=hs.floats(0.5, 30.0))
def test_min_rate_cuts_exactly_the_clients_below_the_rate(
        pieces: list[tuple[int, float]], rate: int, window: float) -> None:
    """Model: a client is cut when, since it last completed rate*window bytes, it has
    kept the agent waiting window s or more; a client that is never cut moved at least
    rate*window bytes in every stretch of window s of waiting."""
    m = MinRate(rate, window)
    moved, waited = 0, 0.0
    for n, w in pieces:
        assert m.budget() == pytest.approx(max(0.0, window - waited))
        ok = m.add(n, w)
        moved, waited = moved + n, waited + w
        if moved >= rate * window:
            moved, waited = 0, 0.0
            assert ok
        else:
            assert ok == (waited < window)
        if not ok:
            break


def test_no_minimum_means_no_budget() -> None:
    assert MinRate(0, 30).budget() is None
    assert MinRate(0, 30).add(0, 1e9)
