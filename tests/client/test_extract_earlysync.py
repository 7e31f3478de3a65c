"""A directory download starts writing its tree out while it still arrives
(aggapi.client.earlysync): syncfs runs during the transfer, one at a time, on an fd of
its own, so the final syncfs on the extractor's fd (which alone decides) waits for the
tail only and still reports any writeback error."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from aggapi.client import earlysync
from aggapi.client.errors import LocalError
from aggapi.client.extract import extract_dir
from aggapi.fs import syncfs
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from tests.client.test_extract_batches import Pieces, end, open_fds
from tests.filetrees import read_tree

pytestmark = pytest.mark.skipif(not syncfs.available(), reason="no syncfs here")


def tree_tar(files: int, size: int) -> tuple[bytes, dict[str, bytes]]:
    out, want = [ANNOUNCEMENT], {}
    for i in range(files):
        data = os.urandom(size)
        want[f"f{i:03d}"] = data
        out.append(ts.header(f"f{i:03d}", ts.REG, size=size, mode=0o644,
                             records=record(hashlib.sha256(data).hexdigest())))
        out.append(data + ts.pad(size))
    out.append(end())
    return b"".join(out), want


def test_the_tree_is_synced_during_the_transfer_and_once_more_at_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ~1 MiB of data in pieces of ~16 KiB; not a multiple of EVERY, so no sync is due
    # exactly at the last byte (whether one started then hung on timing).
    blob, want = tree_tar(60, 16 << 10)
    monkeypatch.setattr(earlysync, "EVERY", 128 << 10)
    stream = Pieces(blob, [16 << 10])
    calls: list[tuple[int, int]] = []  # (fd, stream position when syncfs ran)
    real = syncfs.syncfs

    def spy(fd: int) -> None:
        calls.append((fd, stream.pos))
        real(fd)

    monkeypatch.setattr(syncfs, "syncfs", spy)
    # Where the stream was when each early sync was started, on the loop: the worker
    # may call syncfs only after the last read (so its own position says nothing).
    started: list[int] = []
    wrote = earlysync.EarlySync.wrote

    def spy_wrote(self: earlysync.EarlySync, n: int) -> None:
        before = self.started
        wrote(self, n)
        if self.started > before:
            started.append(stream.pos)

    monkeypatch.setattr(earlysync.EarlySync, "wrote", spy_wrote)
    before = open_fds()

    async def go() -> None:
        await extract_dir(ts.TarReader(stream), tmp_path / "out")
    asyncio.run(go())
    assert read_tree(tmp_path / "out") == want
    assert started and all(pos < len(blob) for pos in started)  # before the end
    assert len(calls) == len(started) + 1  # each early one ran, then the final one
    assert calls[-1][1] == len(blob)  # the final one, after the last byte
    assert calls[-1][0] not in {fd for fd, _ in calls[:-1]}  # an fd of its own
    assert open_fds() == before


def test_early_sync_errors_fail_nothing_the_final_one_decides(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blob, want = tree_tar(16, 16 << 10)
    monkeypatch.setattr(earlysync, "EVERY", 32 << 10)
    early: list[int] = []

    def eio(fd: int) -> None:
        early.append(fd)
        raise OSError(5, "Input/output error")

    # The early syncs' module fails every call; the extractor's final syncfs is real.
    monkeypatch.setattr(earlysync, "syncfs", SimpleNamespace(syncfs=eio,
                                                             available=lambda: True))

    async def go(name: str) -> None:
        await extract_dir(ts.TarReader(Pieces(blob, [8 << 10])), tmp_path / name)
    asyncio.run(go("out"))  # their errors fail nothing: the final syncfs succeeded
    assert read_tree(tmp_path / "out") == want and early

    def final_eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(syncfs, "syncfs", final_eio)  # now the final one fails: nothing
    with pytest.raises(LocalError, match="durable"):  # is placed
        asyncio.run(go("again"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_at_most_one_early_sync_runs_at_a_time(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    blob, want = tree_tar(64, 16 << 10)
    monkeypatch.setattr(earlysync, "EVERY", 16 << 10)
    running, most = [0], [0]
    lock = threading.Lock()
    gate = threading.Event()

    def slow(fd: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        gate.wait(0.05)
        with lock:
            running[0] -= 1

    monkeypatch.setattr(syncfs, "syncfs", slow)

    async def go() -> None:
        await extract_dir(ts.TarReader(Pieces(blob, [16 << 10])), tmp_path / "out")
    asyncio.run(go())
    assert read_tree(tmp_path / "out") == want
    assert most[0] == 1
