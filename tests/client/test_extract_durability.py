"""A downloaded tree is made durable by one syncfs before the rename that publishes
it, not by an fsync per file (issue 27: a journal commit per file was most of a
10,000-file download's time); a failing syncfs fails the copy and publishes nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.client.errors import LocalError
from aggapi.fs import syncfs
from tests.client.test_extract import extract, reg, stream

pytestmark = pytest.mark.skipif(not syncfs.available(), reason="no syncfs on this platform")

NAMES = st.sampled_from(["a", "b", "c"])


def spy(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    real_fsync, real_rename, real_syncfs = os.fsync, os.rename, syncfs.syncfs

    def fsync(fd: int) -> None:
        calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append(("rename", os.fspath(dst)))
        real_rename(src, dst)

    def sync(fd: int) -> None:
        calls.append(("syncfs", os.readlink(f"/proc/self/fd/{fd}")))
        if fail:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_syncfs(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    monkeypatch.setattr(syncfs, "syncfs", sync)
    return calls


@settings(max_examples=25, deadline=None, derandomize=True)
@given(files=st.lists(st.tuples(NAMES, NAMES, st.binary(max_size=300)), min_size=1,
                      max_size=40))
def test_one_syncfs_before_the_rename_and_no_fsync_per_file(files: list[tuple[str, str, bytes]]
                                                            ) -> None:
    """Files in interleaved directories (the extractor keeps the last parent's fd) land
    where their names say, and the only syncs are one syncfs of the temp tree before
    the rename and the fsync of the destination's parent after it."""
    import asyncio
    import tempfile

    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        calls = spy(mp)
        want = {f"{a}/{b}": data for a, b, data in files}  # a later entry wins, as tar
        blob = b"".join(reg(f"{a}/{b}", data) for a, b, data in files)
        dest = Path(d) / "out"
        asyncio.run(extract(stream(blob), dest))
        got = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
        assert got == want
        kinds = [k for k, _ in calls]
        assert kinds == ["syncfs", "rename", "fsync"], calls
        assert calls[0][1].startswith(str(Path(d) / ".out.ncp-"))
        assert calls[2][1] == d


async def test_a_failing_syncfs_publishes_nothing(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy(monkeypatch, fail=True)
    dest = tmp_path / "out"
    with pytest.raises(LocalError, match="durable"):
        await extract(stream(reg("a/f", b"data") + reg("g", b"more")), dest)
    assert os.listdir(tmp_path) == []  # no copy, and the temp tree is removed too
    assert [k for k, _ in calls] == ["syncfs"]


async def test_tar_headers_are_parsed_off_the_event_loop(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """TarReader hands each read to a worker to parse: the parser's body, not just the
    creation of its generator (which on main ran the whole parse on the loop)."""
    import threading

    from aggapi.tar import parse as tarparse

    loop_thread = threading.get_ident()
    seen: list[int] = []
    real = tarparse.TarParser._header

    def spy(self: tarparse.TarParser, blk: bytes) -> Any:
        seen.append(threading.get_ident())
        return real(self, blk)

    monkeypatch.setattr(tarparse.TarParser, "_header", spy)
    await extract(stream(reg("a/f", b"data") + reg("g", b"more")), tmp_path / "out")
    assert seen and loop_thread not in seen


async def test_a_file_entry_over_an_earlier_name(tmp_path: Path) -> None:
    """A file is created without an lstat first; a name taken by an earlier entry is
    cleared as tar does (file or symlink: replaced, never followed) or, for a
    directory, the entry is refused."""
    from tests.client.test_extract import sym

    blob = (reg("f", b"one") + reg("f", b"two") + sym("l", "f") + reg("l", b"mine")
            + reg("d/x", b"in d") + reg("d", b"over a dir"))
    res = await extract(stream(blob), tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "f").read_bytes() == b"two"  # not written through the link
    assert not (out / "l").is_symlink() and (out / "l").read_bytes() == b"mine"
    assert (out / "d/x").read_bytes() == b"in d"
    assert any("would replace a directory" in r for r in res.refused)
