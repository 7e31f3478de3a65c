"""Tar uploads: small files are made durable by one syncfs per file system before the
first rename, not an fsync each (issue 27: a journal commit per file was most of a
10,000-file upload's time); big ones keep their own fsync. A failing syncfs, a refused
entry or an agent killed mid-upload never leaves a tar file visible under its name."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy import tarextract
from aggapi.agent.copy.cleanup import TMP_PREFIX, InflightRecord
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.tarextract import TarExtractor
from aggapi.agent.copy.targetdir import open_target_dir
from aggapi.agent.copy.untar import TarSink
from aggapi.agent.copy.uploadparams import UploadParams
from aggapi.fs import syncfs
from aggapi.status import StatusError
from tests import tarcraft as tc
from tests.agent.copy.conftest import snapshot

pytestmark = pytest.mark.skipif(not syncfs.available(), reason="no syncfs on this platform")

BIG = 4096  # WRITEBACK_STEP for these tests: files from this size keep their own fsync
NAMES = st.sampled_from(["a", "b", "c"])


class Setup:
    def __init__(self, tmp: Path) -> None:
        self.dst = tmp / "root" / "dst"
        self.dst.mkdir(parents=True)
        (self.dst / "keep").write_bytes(b"old")
        self.root = FsRoot(os.open(tmp / "root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                           container_id="dur")
        self.limits = CopyLimits(state_dir=str(tmp / "state"))
        self.record = InflightRecord(self.limits.state_dir, self.root)
        self.fd, _ = open_target_dir(self.root, "/dst", self.record)
        self.ex = TarExtractor(self.root, self.record, self.fd, "/dst", UploadParams())
        self.sink = TarSink(self.ex, self.root, self.limits, pause=lambda: None)

    def close(self) -> None:
        self.ex.close()
        os.close(self.fd)
        self.root.close()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """Every fsync (by inode), syncfs and rename, in order."""
    seen: list[tuple[str, Any]] = []
    real_fsync, real_syncfs, real_rename = os.fsync, syncfs.syncfs, o2.renameat2

    def fsync(fd: int) -> None:
        seen.append(("fsync", os.fstat(fd).st_size))
        real_fsync(fd)

    def sync(fd: int) -> None:
        seen.append(("syncfs", os.fstat(fd).st_dev))
        real_syncfs(fd)

    def rename(*a: Any) -> None:
        seen.append(("rename", a[3]))
        real_rename(*a)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(syncfs, "syncfs", sync)
    monkeypatch.setattr(o2, "renameat2", rename)
    monkeypatch.setattr(tarextract, "WRITEBACK_STEP", BIG)
    yield seen


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(st.tuples(NAMES, NAMES, st.sampled_from([0, 100, BIG - 1, BIG, 3 * BIG])),
                      min_size=1, max_size=30))
def test_small_files_share_one_syncfs_before_the_first_rename(
        tmp_path_factory: pytest.TempPathFactory, calls: list[tuple[str, Any]],
        files: list[tuple[str, str, int]]) -> None:
    """Files in interleaved directories (the extractor keeps the last parent's fd) land
    where their names say; only the big ones were fsynced, and one syncfs of the
    target's file system came before any rename if a small one was among them."""
    calls.clear()
    s = Setup(tmp_path_factory.mktemp("t"))
    try:
        body = b"".join(tc.entry(f"{a}/{b}".encode(), bytes([65 + n % 26]) * n)
                        for a, b, n in files) + tc.ZERO2
        s.sink.feed_many([body[i:i + 1000] for i in range(0, len(body), 1000)])
        s.sink.finish()
        s.ex.commit()
        last = {f"{a}/{b}": n for a, b, n in files}  # a later entry of a name wins
        got = {str(p.relative_to(s.dst)): p.read_bytes() for p in s.dst.rglob("*")
               if p.is_file()}
        assert got == {"keep": b"old"} | {k: bytes([65 + n % 26]) * n for k, n in last.items()}
        first = next(i for i, (k, _) in enumerate(calls) if k == "rename")
        before, after = calls[:first], calls[first:]
        assert {k for k, _ in after} == {"rename"}
        assert sorted(n for k, n in before if k == "fsync") == sorted(n for *_, n in files
                                                                      if n >= BIG)
        small = any(n < BIG for *_, n in files)
        assert [d for k, d in before if k == "syncfs"] == ([os.stat(s.dst).st_dev] if small
                                                           else [])
    finally:
        s.close()


def test_a_failing_syncfs_renames_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    def eio(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(syncfs, "syncfs", eio)
    s = Setup(tmp_path)
    try:
        before = snapshot(s.dst)
        s.sink.feed_many([tc.entry(b"d/f", b"new") + tc.entry(b"keep", b"x") + tc.ZERO2])
        s.sink.finish()
        with pytest.raises(OSError) as err:
            s.ex.commit()
        assert err.value.errno == errno.EIO
        s.ex.rollback()
        after = snapshot(s.dst)
        assert {k: v for k, v in after.items() if k != str(s.dst / "d")} == before
    finally:
        s.close()


def test_an_agent_killed_mid_upload_leaves_only_recorded_temps(tmp_path: Path) -> None:
    """Killed after some files were written (no rollback, no commit): none of them is
    visible under its name; what is there beyond the old tree are temp names of the
    upload's record (which the next agent's clean-up removes) and the directories."""
    s = Setup(tmp_path)
    try:
        before = snapshot(s.dst)
        body = b"".join(tc.entry(f"d{i % 3}/f{i}".encode(), b"z" * i) for i in range(40))
        s.sink.feed_many([body + tc.entry(b"keep", b"replaced")])  # no end of archive yet
        after = snapshot(s.dst)
        extra = {Path(k) for k in after.keys() - before.keys()}
        assert after[str(s.dst / "keep")] == b"old"
        dirs = {p for p in extra if p.is_dir()}
        assert {p.name for p in dirs} == {"d0", "d1", "d2"}
        token = s.record.token
        assert all(p.name.startswith(f"{TMP_PREFIX}{token}-") for p in extra - dirs)
        assert len(extra - dirs) == 41  # "keep" too: its temp, never renamed
        recorded = Path(s.record.path).read_text()
        assert all(f'"/dst/d{i}"' in recorded for i in range(3))
    finally:
        s.close()


def test_commit_needs_the_container(tmp_path: Path) -> None:
    """The last liveness check still comes before the syncfs and the renames."""
    s = Setup(tmp_path)
    try:
        s.sink.feed_many([tc.entry(b"f", b"1") + tc.ZERO2])
        s.sink.finish()

        def gone() -> None:
            raise StatusError(409, "container gone")

        s.root.ensure_alive = gone  # type: ignore[method-assign]
        with pytest.raises(StatusError):
            s.ex.commit()
        assert not (s.dst / "f").exists()
    finally:
        s.close()




@pytest.mark.parametrize("overwrite, appears, result", [
    (True, "file", "replaced"), (False, "file", 409), (True, "dir", 409),
    (False, None, "created")])
def test_a_name_appearing_before_commit(tmp_path: Path, overwrite: bool, appears: str | None,
                                        result: str | int) -> None:
    """The commit renames without replacing first; a name that appeared since the entry
    was written gets the same checks as at its start: replaced only with overwrite, and
    never a directory."""
    s = Setup(tmp_path)
    s.ex.params = UploadParams(overwrite=overwrite)
    try:
        s.sink.feed_many([tc.entry(b"new", b"tar") + tc.ZERO2])
        s.sink.finish()
        if appears == "file":
            (s.dst / "new").write_bytes(b"theirs")
        elif appears == "dir":
            (s.dst / "new").mkdir()
        if isinstance(result, int):
            with pytest.raises(StatusError) as err:
                s.ex.commit()
            assert err.value.code == result
            s.ex.rollback()
            assert (s.dst / "new").is_dir() if appears == "dir" else \
                (s.dst / "new").read_bytes() == b"theirs"
        else:
            s.ex.commit()
            assert (s.dst / "new").read_bytes() == b"tar"
        assert not [n for n in os.listdir(s.dst) if n.startswith(TMP_PREFIX)]
    finally:
        s.close()


def test_a_container_exiting_mid_tar_stops_it_within_a_slice(tmp_path: Path) -> None:
    """The liveness poll runs once per ENTRIES_PER_YIELD entries, not per entry: a
    container that exits stops the extraction within that many entries."""
    from aggapi.agent.copy.untar import ENTRIES_PER_YIELD

    s = Setup(tmp_path)
    polls = 0
    dead_after = 3 * ENTRIES_PER_YIELD + 5

    def alive() -> None:
        nonlocal polls
        polls += 1
        if s.sink.entries >= dead_after:
            raise StatusError(409, "container exited")

    s.root.ensure_alive = alive  # type: ignore[method-assign]
    try:
        body = b"".join(tc.entry(f"f{i}".encode(), b"x") for i in range(10 * ENTRIES_PER_YIELD))
        with pytest.raises(StatusError):
            s.sink.feed_many([body + tc.ZERO2])
        assert dead_after <= s.sink.entries <= dead_after + ENTRIES_PER_YIELD
        assert polls <= s.sink.entries // ENTRIES_PER_YIELD + 1
    finally:
        s.sink.abort()
        s.ex.rollback()
        s.close()
