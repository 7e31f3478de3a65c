"""Issue 24 finding 2: hashing is bounded. HEAD holds a copy slot, hashes only files
within the size limit (a larger one is a 413, as its GET: issue 35), and a hash whose
client went away gives its worker thread back within a chunk."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggapi.agent.copy import digests
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver

TiB = 1 << 40
GiB = 1 << 30
WORKERS = 4  # conftest.build_app's pool


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)  # `truncate -s`: no blocks, reads as zeros
    return path


async def _small_download_seconds(cc: Any, path: str, within: float) -> float:
    t0 = time.monotonic()
    r = await asyncio.wait_for(cc.get(path), within)
    assert r.status == 200 and await r.read() == b"small\n"
    return time.monotonic() - t0


async def test_head_of_a_huge_sparse_file_is_refused_at_once_as_get_is(
        plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> None:
    root, _ = plain
    _sparse(root / "huge", 4 * TiB)
    (root / "small").write_bytes(b"small\n")
    # One tenant here: its share of the node is the whole node, so the 9th copy gets a
    # slot and the test measures the workers, not the namespace share.
    lim = CopyLimits(size_limit=limits.size_limit, copies_per_pod=16, copies_per_node=16,
                     state_dir=limits.state_dir, namespace_share=1.0)
    cc = await serve(DirResolver(root), lim)
    t0 = time.monotonic()
    # HEAD answers what GET would: a 413, before any hashing.
    r = await asyncio.wait_for(cc.head("/huge"), 5)
    assert r.status == 413 and time.monotonic() - t0 < 1.0
    assert not {"X-Aggapi-Sha256", "Digest", "Repr-Digest"} & set(r.headers)
    # 8 HEADs at once (twice the worker pool) leave the workers free for others.
    heads = [asyncio.create_task(cc.head("/huge")) for _ in range(2 * WORKERS)]
    assert await _small_download_seconds(cc, "/small", 3) < 1.0
    done = await asyncio.wait_for(asyncio.gather(*heads), 5)
    assert all(h.status == 413 for h in done)
    assert (await cc.get("/huge")).status == 413


async def test_head_holds_a_copy_slot(plain: tuple[Path, Path], serve: Any,
                                      limits: CopyLimits) -> None:
    root, _ = plain
    (root / "f").write_bytes(b"x")
    lim = CopyLimits(copies_per_pod=1, state_dir=limits.state_dir)
    cc = await serve(DirResolver(root), lim)
    with cc.state.slots.slot("pod-uid-1"):  # conftest.POD_UID: the pod's one slot is taken
        r = await cc.head("/f")
        assert r.status == 429 and r.headers["Retry-After"] == str(lim.retry_after)
    assert (await cc.head("/f")).status == 200


async def test_a_head_within_the_limit_still_gets_the_digest(
        plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> None:
    root, _ = plain
    (root / "f").write_bytes(b"abc")
    cc = await serve(DirResolver(root), limits)
    r = await cc.head("/f")
    assert r.headers["X-Aggapi-Sha256"] == \
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


async def test_a_cancelled_hash_frees_its_worker(plain: tuple[Path, Path], serve: Any,
                                                 limits: CopyLimits) -> None:
    """Clients asking for the digest of a large file (within the limit) and leaving:
    their hashes stop, so other copies do not wait for the whole files to be read."""
    root, _ = plain
    (root / "small").write_bytes(b"small\n")
    for i in range(WORKERS):
        _sparse(root / f"big{i}", 48 * GiB)  # ~20 s each to hash
    lim = CopyLimits(size_limit=64 * GiB, copies_per_pod=16, copies_per_node=16,
                     state_dir=limits.state_dir)
    cc = await serve(DirResolver(root), lim, handler_cancellation=True)
    base = cc.client.make_url("/v1/copy")
    async with aiohttp.ClientSession() as s:
        async def leave_early(i: int) -> None:
            headers = cc._headers("copy.stat", f"/big{i}", {}, None)
            try:
                async with s.head(base, params={"container": "c", "path": f"/big{i}"},
                                  headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=0.5)):
                    raise AssertionError("a 48 GiB hash finished in 0.5 s")
            except TimeoutError:
                pass

        await asyncio.gather(*(leave_early(i) for i in range(WORKERS)))
    # Every worker was hashing; within a chunk each notices its client left.
    assert await _small_download_seconds(cc, "/small", 3) < 1.5
    deadline = time.monotonic() + 2
    while cc.state.slots.total and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    assert cc.state.slots.total == 0


def test_digest_stops_when_cancelled(tmp_path: Path) -> None:
    f = _sparse(tmp_path / "big", 8 * GiB)
    cancel = threading.Event()
    fd = os.open(f, os.O_RDONLY)
    try:
        cache = digests.DigestCache()
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["digest"] = cache.digest(fd, 8 * GiB, cancel)
            except digests.Cancelled:
                result["cancelled"] = time.monotonic()

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.1)
        set_at = time.monotonic()
        cancel.set()
        t.join(5)
        assert not t.is_alive() and result["cancelled"] - set_at < 0.5
        assert cache.cached(fd, 8 * GiB) is None
    finally:
        os.close(fd)


@pytest.mark.parametrize("size", [0, 1, (1 << 20) + 3])
def test_digest_without_cancel_is_the_sha256(tmp_path: Path, size: int) -> None:
    import hashlib
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        digest = digests.DigestCache().digest(fd, size, threading.Event())
        assert digest == hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
