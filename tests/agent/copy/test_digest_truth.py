"""Issue 24 finding 7: the digest cache never serves an old version's digest.

A container process owns the files it uploads into, the temp file included, and
may rewrite one at the same size within a timestamp tick; neither may leave HEAD
or GET with a Digest of other bytes than the file holds."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy import digests
from aggapi.agent.copy.digests import DigestCache, key_of
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver, temp_leftovers

MiB = 1 << 20


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _digests(cc: Any, path: str) -> tuple[str, str, bytes]:
    head = await cc.head(path)
    got = await cc.get(path)
    assert head.status == 200 and got.status == 200
    return head.headers["X-Aggapi-Sha256"], got.headers["X-Aggapi-Sha256"], await got.read()


def _tamper(root: Path) -> bool:
    """As the container: rewrite the start of the upload's temp file once it holds a
    MiB; False while it does not yet."""
    tmp = temp_leftovers(root)
    if not tmp or os.path.getsize(tmp[0]) < MiB:
        return False
    with open(tmp[0], "r+b") as f:
        f.write(b"X" * 4096)
    return True


async def test_temp_file_rewritten_during_the_upload(cc: Any, plain: tuple[Path, Path]
                                                    ) -> None:
    """The container rewrites ``.aggapi-tmp-*`` (same size) while the upload runs: the
    digests served afterwards are of what the file holds, not of what was sent."""
    root, _ = plain
    first, rest = b"a" * (2 * MiB), b"b" * MiB
    tampered = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield first
        # The agent wrote the first batch into its temp file: the container rewrites it.
        deadline = time.monotonic() + 5
        while not _tamper(root):
            assert time.monotonic() < deadline, "the temp file never filled"
            await asyncio.sleep(0.01)
        tampered.set()
        yield rest

    r = await cc.post("/f.bin", body())
    assert r.status == 200 and tampered.is_set(), await r.text()
    on_disk = (root / "f.bin").read_bytes()
    assert on_disk != first + rest
    head, get, data = await _digests(cc, "/f.bin")
    assert data == on_disk
    assert head == get == sha(on_disk)


async def test_no_seed_from_an_upload(cc: Any, plain: tuple[Path, Path]) -> None:
    """The committed file's ctime is the rename's: a container write in that tick would
    keep the key, so the upload's digest is not cached."""
    root, _ = plain
    data = os.urandom(MiB + 5)
    r = await cc.post("/f.bin", data, sha256=sha(data))
    assert r.status == 200, await r.text()
    assert cc.state.digests.get(key_of(os.stat(root / "f.bin"))) is None
    assert (await cc.get("/f.bin")).headers["X-Aggapi-Sha256"] == sha(data)


@pytest.fixture
def coarse_fs(tmp_path: Path) -> Iterator[Path]:
    """ext4 with 128-byte inodes: whole-second timestamps, so "within a tick" is easy to
    hit (on a fine-grained file system the same race needs luck)."""
    img = tmp_path / "fs.img"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(16 * MiB)
    try:
        subprocess.run(["mkfs.ext4", "-q", "-I", "128", str(img)], check=True,
                       capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True,
                       capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a loop ext4 here: {exc}")
    try:
        (mnt / "root").mkdir()
        yield mnt / "root"
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


async def test_same_size_rewrite_within_a_tick(coarse_fs: Path, serve: Any,
                                               limits: CopyLimits) -> None:
    cc = await serve(DirResolver(coarse_fs), limits)
    f = coarse_fs / "f"
    for _attempt in range(5):
        f.write_bytes(b"a" * 4096)
        second = os.stat(f).st_ctime_ns // 10**9
        head, get, _ = await _digests(cc, "/f")
        f.write_bytes(b"b" * 4096)  # same size, same second: the same (size, mtime, ctime)
        if os.stat(f).st_ctime_ns // 10**9 == second:
            break
    else:
        pytest.skip("could not rewrite within one second")
    assert head == get == sha(b"a" * 4096)
    head, get, data = await _digests(cc, "/f")
    assert data == b"b" * 4096
    assert head == get == sha(data)


def test_a_settled_file_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file unchanged for longer than the settling time is hashed once."""
    monkeypatch.setattr(digests, "SETTLE_NS", 0)
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    time.sleep(0.05)  # past the coarse clock's tick
    fd = os.open(f, os.O_RDONLY)
    try:
        cache = DigestCache()
        assert cache.digest(fd, 100) == sha(b"x" * 100)
        assert cache.cached(fd, 100) == sha(b"x" * 100)
    finally:
        os.close(fd)


def test_a_fresh_file_is_not_cached(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    fd = os.open(f, os.O_RDONLY)
    try:
        cache = DigestCache()
        assert cache.digest(fd, 100) == sha(b"x" * 100)
        assert cache.cached(fd, 100) is None
    finally:
        os.close(fd)
