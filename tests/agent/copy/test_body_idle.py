"""--body-idle-timeout: an upload whose client goes silent is aborted with 408, its copy
slot freed and its temp files removed (issue 13, finding 7)."""

from __future__ import annotations

import asyncio
import dataclasses
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver, HeldBody, snapshot, temp_leftovers

IDLE = 1.0
# Far beyond IDLE: only an upload that is never aborted runs into it.
MARGIN = 30.0


@pytest.fixture
async def cc(plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> Any:
    # One slot per pod: a stalled upload that kept its slot would refuse the next one.
    one_slot = dataclasses.replace(limits, copies_per_pod=1, body_idle_timeout=IDLE)
    return await serve(DirResolver(plain[0]), one_slot)


async def _aborted(cc: Any, path: str, body: HeldBody, chunks: AsyncIterator[bytes],
                   **params: str) -> dict[str, Any]:
    try:
        r = await asyncio.wait_for(cc.post(path, chunks, **params), MARGIN)
        assert r.status == 408, await r.text()
        status: dict[str, Any] = await r.json()
        return status
    finally:
        body.release.set()  # let the client's writer finish; the server has moved on


async def test_stalled_raw_upload_frees_its_slot_and_leaves_no_temp_file(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "t").write_bytes(b"before")
    body = HeldBody(first=2)
    status = await _aborted(cc, "/t", body, body.chunks())
    assert status["kind"] == "Status" and status["reason"] == "Timeout"
    assert "no request body bytes" in status["message"]
    assert (root / "t").read_bytes() == b"before"
    assert temp_leftovers(root) == []
    r = await asyncio.wait_for(cc.post("/t", b"after"), MARGIN)  # needs the only slot
    assert r.status == 200, await r.text()
    assert (root / "t").read_bytes() == b"after"


async def test_stalled_tar_upload_is_a_timeout_not_a_bad_tar(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    before = snapshot(root)
    info = tarfile.TarInfo("sub/big")
    info.size = 8 << 20
    head = info.tobuf(format=tarfile.PAX_FORMAT)
    body = HeldBody(first=1)

    async def chunks() -> AsyncIterator[bytes]:
        yield head
        async for c in body.chunks():
            yield c

    status = await _aborted(cc, "/dir", body, chunks(), format="tar")
    assert status["code"] == 408, status
    assert snapshot(root) == before  # nothing created, no temp file
    r = await asyncio.wait_for(cc.post("/t", b"x"), MARGIN)
    assert r.status == 200, await r.text()


async def test_a_slow_but_steady_upload_is_not_cut(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(6):  # 1.5 s in all, never IDLE s without a byte
            yield b"z" * 1000
            await asyncio.sleep(IDLE / 4)

    r = await asyncio.wait_for(cc.post("/slow", chunks()), MARGIN)
    assert r.status == 200, await r.text()
    assert (root / "slow").read_bytes() == b"z" * 6000
