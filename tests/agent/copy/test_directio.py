"""O_DIRECT uploads (directio): the same bytes and sha256 as buffered writes, whatever
the piece sizes, and buffered writes wherever the file system refuses O_DIRECT."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import atomic, directio
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver

BLOCK = directio.BLOCK


def _flags(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_GETFL)


@pytest.fixture()
def target(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    yield fd
    os.close(fd)


def _pieces(sizes: list[int], seed: bytes) -> list[bytes]:
    out, n = [], 0
    for s in sizes:
        out.append(hashlib.shake_256(seed + n.to_bytes(8, "big")).digest(s))
        n += 1
    return out


@settings(max_examples=25, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 3 * BLOCK // 2), max_size=5), max_size=5),
       seed=st.binary(max_size=8))
def test_bytes_and_hash_match_the_stream(tmp_path_factory: pytest.TempPathFactory,
                                         batches: list[list[int]], seed: bytes) -> None:
    path = tmp_path_factory.mktemp("d") / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    w = directio.DirectWriter.start(fd)
    assert w is not None, "this test needs a file system with O_DIRECT (ext4, xfs)"
    h, want = hashlib.sha256(), hashlib.sha256()
    written = b""
    try:
        for i, sizes in enumerate(batches):
            pieces = _pieces(sizes, seed + bytes([i]))
            w.write_many(pieces, h)
            for p in pieces:
                want.update(p)
                written += p
        assert _flags(fd) & os.O_DIRECT
        w.finish(h)
        # A tail (a partial block) goes buffered.
        assert bool(_flags(fd) & os.O_DIRECT) == (len(written) % BLOCK == 0)
    finally:
        w.close()
        os.close(fd)
    assert h.hexdigest() == want.hexdigest()
    assert path.read_bytes() == written


def test_whole_blocks_go_direct_before_finish(target: int) -> None:
    w = directio.DirectWriter.start(target)
    assert w is not None
    h = hashlib.sha256()
    w.write_many([b"a" * (BLOCK - 10), b"b" * 20], h)
    assert os.fstat(target).st_size == BLOCK  # one block written, 10 bytes held
    w.finish(h)
    w.close()
    assert os.fstat(target).st_size == BLOCK + 10
    assert h.hexdigest() == hashlib.sha256(b"a" * (BLOCK - 10) + b"b" * 20).hexdigest()


def test_refused_by_fcntl_means_buffered(target: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "no O_DIRECT here")
        return real(fd, cmd, arg)

    real = fcntl.fcntl
    monkeypatch.setattr(directio.fcntl, "fcntl", refuse)
    assert directio.DirectWriter.start(target) is None
    assert not _flags(target) & os.O_DIRECT


def test_a_write_refused_midway_is_retried_buffered(
        target: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """EINVAL from an O_DIRECT write (a file system that accepts the flag but not the
    alignment) loses no byte: the same block is written again, buffered."""
    real = os.write
    refused: list[int] = []

    def write(fd: int, data: memoryview) -> int:
        if fd == target and _flags(fd) & os.O_DIRECT and len(refused) == 0:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "unaligned")
        return real(fd, data)

    monkeypatch.setattr(directio.os, "write", write)
    w = directio.DirectWriter.start(target)
    assert w is not None
    h = hashlib.sha256()
    data = os.urandom(2 * BLOCK + 5)
    w.write_many([data], h)
    w.finish(h)
    w.close()
    assert refused == [BLOCK]
    assert not _flags(target) & os.O_DIRECT
    with open(f"/proc/self/fd/{target}", "rb") as f:
        assert f.read() == data
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()


def test_other_write_errors_are_raised(target: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int, data: memoryview) -> int:
        raise OSError(errno.ENOSPC, "full")

    monkeypatch.setattr(directio.os, "write", full)
    w = directio.DirectWriter.start(target)
    assert w is not None
    with pytest.raises(OSError) as exc:
        w.write_many([b"x" * BLOCK], hashlib.sha256())
    w.close()
    assert exc.value.errno == errno.ENOSPC


@pytest.mark.parametrize("direct", [True, False])
def test_atomic_file_same_result_either_way(tmp_path: Path, direct: bool) -> None:
    (tmp_path / "root").mkdir()
    root = DirResolver(tmp_path / "root").open()
    dir_fd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    af = atomic.AtomicFile(root, InflightRecord(str(tmp_path / "state"), root), dir_fd, "/",
                           "f", direct=direct)
    data = os.urandom(3 * BLOCK + 4097)
    try:
        assert (af._direct is not None) == direct
        af.write_many([data[:100], data[100:BLOCK + 7]])
        af.write_many([data[BLOCK + 7:]])
        digest = af.finish(expect_size=len(data), expect_sha256=None, owner=atomic.Owner(),
                           replaced=None)
        af.commit(overwrite=True)
    finally:
        af.abort()
        os.close(dir_fd)
    assert af._direct is None  # the buffer is released with the file
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "root" / "f").read_bytes() == data


@pytest.mark.parametrize(("least", "size", "want"), [
    (4 << 20, 5 << 20, True), (4 << 20, 3 << 20, False), (0, 5 << 20, False)])
async def test_uploads_go_direct_from_the_configured_size(
        serve: Any, plain: tuple[Path, Path], limits: CopyLimits,
        monkeypatch: pytest.MonkeyPatch, least: int, size: int, want: bool) -> None:
    """--copy-direct-io-min-size: from that many bytes through O_DIRECT; 0: never."""
    started: list[int] = []
    real = directio.DirectWriter.start

    def start(fd: int) -> directio.DirectWriter | None:
        started.append(fd)
        return real(fd)

    monkeypatch.setattr(directio.DirectWriter, "start", start)
    cc = await serve(DirResolver(plain[0]), replace(limits, direct_io_min_size=least))
    data = os.urandom(size)
    r = await cc.post("/big.bin", data)
    assert r.status in (200, 201), await r.text()
    assert (await r.json())["sha256"] == hashlib.sha256(data).hexdigest()
    assert (plain[0] / "big.bin").read_bytes() == data
    assert bool(started) == want
