"""A raw upload leaves its sha256 in the digest cache, so the download that follows does
not read the whole file again; but only while the file is the one the upload wrote."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy import atomic
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.digests import DigestCache, key_of
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver


@pytest.fixture
async def cc(plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> Any:
    return await serve(DirResolver(plain[0]), limits)


async def test_download_after_upload_uses_the_uploads_digest(
        cc: Any, plain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = plain
    data = os.urandom((1 << 20) + 5)
    digest = hashlib.sha256(data).hexdigest()
    r = await cc.post("/f.bin", data, sha256=digest)
    assert r.status == 200, await r.text()
    assert cc.state.digests.get(key_of(os.stat(root / "f.bin"))) == digest

    class NoHashing:
        @staticmethod
        def sha256() -> Any:
            raise AssertionError("the digest should have come from the cache")

    monkeypatch.setattr("aggapi.agent.copy.digests.hashlib", NoHashing)
    r = await cc.get("/f.bin")
    assert r.status == 200 and await r.read() == data
    assert r.headers["X-Aggapi-Sha256"] == digest


async def test_a_file_changed_after_upload_is_hashed_again(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    r = await cc.post("/f.bin", b"a" * 4096)
    assert r.status == 200, await r.text()
    other = b"b" * 4096  # same size: only mtime and ctime tell the versions apart
    await asyncio.sleep(0.02)  # past the kernel's coarse timestamp tick
    (root / "f.bin").write_bytes(other)
    r = await cc.get("/f.bin")
    assert r.status == 200 and await r.read() == other
    assert r.headers["X-Aggapi-Sha256"] == hashlib.sha256(other).hexdigest()


def _atomic_file(tmp_path: Path) -> tuple[atomic.AtomicFile, int]:
    (tmp_path / "root").mkdir()
    root = DirResolver(tmp_path / "root").open()
    dir_fd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    af = atomic.AtomicFile(root, InflightRecord(str(tmp_path / "state"), root), dir_fd, "/",
                           "f")
    return af, dir_fd


def test_no_key_when_someone_else_wrote_the_temp_file(tmp_path: Path) -> None:
    af, dir_fd = _atomic_file(tmp_path)
    try:
        af.write(b"x" * 100)
        af.finish(expect_size=None, expect_sha256=None, owner=atomic.Owner(), replaced=None)
        time.sleep(0.02)
        fd = os.open(af.tmp, os.O_WRONLY, dir_fd=dir_fd)  # the container, by the temp name
        os.write(fd, b"y")
        os.close(fd)
        af.commit(overwrite=True)
        assert af.digest_key() is None
    finally:
        af.abort()
        os.close(dir_fd)


def test_key_is_the_committed_files(tmp_path: Path) -> None:
    af, dir_fd = _atomic_file(tmp_path)
    try:
        af.write(b"x" * 100)
        digest = af.finish(expect_size=100, expect_sha256=None, owner=atomic.Owner(),
                           replaced=None)
        assert af.digest_key() is None  # not before the rename (it changes ctime)
        af.commit(overwrite=True)
        key = af.digest_key()
        assert key == key_of(os.stat(tmp_path / "root" / "f"))
        fd = os.open(tmp_path / "root" / "f", os.O_RDONLY)
        try:
            cache = DigestCache()
            assert cache.digest(fd) == digest  # what a cold download computes
        finally:
            os.close(fd)
    finally:
        af.abort()
        os.close(dir_fd)
