"""Early writeback of uploads (sync_file_range) and that it never changes the bytes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from aggapi.agent.copy import atomic
from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.cleanup import InflightRecord
from tests.agent.copy.conftest import DirResolver


def test_start_writeback_on_a_file_and_refused_on_a_pipe(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x" * (1 << 20))
        assert o2.start_writeback(fd, 0, 1 << 20)
    finally:
        os.close(fd)
    r, w = os.pipe()
    try:
        assert not o2.start_writeback(w, 0, 1)  # ESPIPE: reported, not raised
    finally:
        os.close(r)
        os.close(w)


def test_atomic_file_writes_back_in_steps_and_keeps_content(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    real = o2.start_writeback

    def spy(fd: int, off: int, n: int) -> bool:
        calls.append((off, n))
        return real(fd, off, n)

    monkeypatch.setattr(o2, "start_writeback", spy)
    (tmp_path / "root").mkdir()
    root = DirResolver(tmp_path / "root").open()
    dir_fd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    af = atomic.AtomicFile(root, InflightRecord(str(tmp_path / "state"), root), dir_fd, "/",
                           "f")
    try:
        data = os.urandom(1 << 20)
        for _ in range(20):
            af.write(data)
        step = atomic.WRITEBACK_STEP // (1 << 20)
        assert calls == [(i * atomic.WRITEBACK_STEP, atomic.WRITEBACK_STEP)
                         for i in range(20 // step)]
        af.finish(expect_size=20 << 20, expect_sha256=None, owner=atomic.Owner(),
                  replaced=None)
        af.commit(overwrite=True)
        got = hashlib.sha256((tmp_path / "root" / "f").read_bytes()).hexdigest()
        assert got == hashlib.sha256(data * 20).hexdigest()
    finally:
        af.abort()
        os.close(dir_fd)
