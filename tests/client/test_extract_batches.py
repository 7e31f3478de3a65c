"""A directory download is applied in batches (issue 27 item 3): each piece of the
stream goes to one worker-thread call that parses it and applies every entry it
completes, so file creation runs beside the event loop, not on it, and a piece of a
dozen small files costs one hand-off. Pieces end anywhere (inside a header, a PAX
record, a file's data); whatever the cut, the tree, the per-file sha256 check and
the refusals are those of the whole stream, and a failure leaves no fd open."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.client import fastpath
from aggapi.client.errors import IntegrityError, TransferError
from aggapi.client.extract import ExtractResult, extract_dir
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from tests.filetrees import read_tree

# Every test on both extraction paths (the compiled loop where it is built).
pytestmark = pytest.mark.usefixtures("extract_path")

PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Pieces:
    """An async byte stream handing over ``data`` in the given piece sizes (cycled)."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self.data, self.sizes, self.pos, self.reads = data, sizes, 0, 0

    async def read(self, n: int = -1) -> bytes:
        size = self.sizes[self.reads % len(self.sizes)]
        self.reads += 1
        out = self.data[self.pos:self.pos + min(size, n)]
        self.pos += len(out)
        await asyncio.sleep(0)
        return out

    async def readexactly(self, n: int) -> bytes:
        raise NotImplementedError


def reg(name: str, data: bytes, mode: int = 0o644, digest: str | None = None) -> bytes:
    rec = record(digest or hashlib.sha256(data).hexdigest())
    return (ts.header(name, ts.REG, size=len(data), mode=mode, mtime_ns=1_600_000_000_5 * 10**8,
                      records=rec) + data + ts.pad(len(data)))


def end() -> bytes:
    return (ts.pax_header("./", {"AGGAPI.complete": "true"}, typeflag=ts.PAX)
            + ts.header("./", ts.DIR, mode=0o755) + ts.END)


def extract(blob: bytes, dest: Path, sizes: list[int]) -> ExtractResult:
    async def go() -> ExtractResult:
        return await extract_dir(ts.TarReader(Pieces(blob, sizes)), dest)
    return asyncio.run(go())


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


FILES = st.dictionaries(st.sampled_from(["a", "b", "d/c", "d/e", "f/g/h", "i"]),
                        st.binary(max_size=3000), min_size=1, max_size=6)
CUTS = st.lists(st.integers(1, 2000), min_size=1, max_size=8)


@PROPS
@given(FILES, CUTS, st.data())
def test_any_cut_of_the_stream_gives_the_same_tree_and_the_same_digest_failure(
        files: dict[str, bytes], cuts: list[int], data: st.DataObject) -> None:
    """Pieces of any size (a boundary inside a header, a record or a file's data), and
    a wrong digest on any one file: the copy fails naming that file, publishes nothing,
    removes its temp dir and leaves no fd open; with every digest right, the tree is
    the stream's."""
    tmp = Path(tempfile.mkdtemp(prefix="dl-batches-"))
    try:
        body = [reg(n, d) for n, d in files.items()]
        good = ANNOUNCEMENT + b"".join(body) + end()
        assert read_tree_of(good, tmp / "ok", cuts) == files
        bad = data.draw(st.sampled_from(sorted(files)))
        body = [reg(n, d, digest="0" * 64 if n == bad else None) for n, d in files.items()]
        before = open_fds()
        with pytest.raises(IntegrityError, match=re.escape(f"sha256 mismatch for '{bad}'")):
            extract(ANNOUNCEMENT + b"".join(body) + end(), tmp / "bad", cuts)
        assert open_fds() == before
        assert sorted(os.listdir(tmp)) == ["ok"]
    finally:
        shutil.rmtree(tmp)


def read_tree_of(blob: bytes, dest: Path, cuts: list[int]) -> dict[str, bytes]:
    res = extract(blob, dest, cuts)
    assert res.verified and res.refused == []
    return read_tree(dest)


@PROPS
@given(st.integers(1, 600), st.sampled_from(["../x", "/abs", "s/in", "d/../../x"]))
def test_hostile_names_are_refused_whatever_the_cut(cut: int, name: str) -> None:
    """A link leaving the tree, a file through a link, '..' and absolute names: each
    refused on its own, the rest of the piece applied."""
    tmp = Path(tempfile.mkdtemp(prefix="dl-batches-"))
    try:
        blob = (ANNOUNCEMENT + ts.header("out", ts.SYM, linkname="/etc")
                + ts.header("d/", ts.DIR, mode=0o755) + ts.header("s", ts.SYM, linkname="d")
                + reg(name, b"evil") + reg("ok", b"fine") + end())
        res = extract(blob, tmp / "dst", [cut])
        assert read_tree(tmp / "dst") == {"ok": b"fine"}
        assert len(res.refused) == 2, res.refused  # the link to /etc, and the file
        assert os.listdir(tmp / "dst/d") == [] and os.listdir(tmp) == ["dst"]
    finally:
        shutil.rmtree(tmp)


def test_files_are_created_and_written_off_the_event_loop(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          extract_path: str) -> None:
    """The syscalls of each file (create, write, utime) run in a worker thread, beside
    the loop's receiving; on main they ran on the loop itself. (The compiled loop makes
    them itself: its calls are what runs in the worker.)"""
    seen: list[int] = []
    real_open, real_write = os.open, os.write
    if extract_path == "compiled":
        native = fastpath._native
        assert native is not None

        def spy_run(*args: object) -> object:
            seen.append(threading.get_ident())
            return native.run(*args)

        monkeypatch.setattr(fastpath, "_native", SimpleNamespace(run=spy_run))

    def spy_open(path: str, flags: int, *a: object, **kw: object) -> int:
        if flags & os.O_CREAT:
            seen.append(threading.get_ident())
        return real_open(path, flags, *a, **kw)  # type: ignore[arg-type]

    def spy_write(fd: int, data: bytes) -> int:
        seen.append(threading.get_ident())
        return real_write(fd, data)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "write", spy_write)
    files = {f"d/f{i}": bytes([i]) * 100 for i in range(20)}
    blob = ANNOUNCEMENT + b"".join(reg(n, d) for n, d in files.items()) + end()
    loop_thread = threading.get_ident()  # asyncio.run runs the loop in this thread
    extract(blob, tmp_path / "dst", [len(blob)])
    assert (len(seen) == 40 if extract_path == "python" else seen) and loop_thread not in seen
    assert read_tree(tmp_path / "dst") == files


def test_a_whole_piece_of_small_files_is_one_hand_off(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """100 files arriving in one piece cost a handful of worker calls (the piece, the
    directory times), not one or more per file."""
    loop_calls = 0
    real = asyncio.BaseEventLoop.run_in_executor

    def count(self: asyncio.BaseEventLoop, *a: object) -> asyncio.Future[object]:
        nonlocal loop_calls
        loop_calls += 1
        return real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(asyncio.BaseEventLoop, "run_in_executor", count)
    files = {f"f{i:03d}": os.urandom(100) for i in range(100)}
    blob = ANNOUNCEMENT + b"".join(reg(n, d) for n, d in files.items()) + end()
    extract(blob, tmp_path / "dst", [len(blob)])
    assert read_tree(tmp_path / "dst") == files
    assert loop_calls <= 3


def test_a_tree_without_symlinks_is_not_walked_again(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The recheck of symlinks (a walk of the whole tree, an lstat per entry) runs only
    when the stream made a symlink; with one, it still runs and drops a link a later
    entry turned outward."""
    walks: list[str] = []
    real = os.walk

    def spy(top: str, *a: Any, **kw: Any) -> Any:
        if ".ncp-" in os.path.basename(top):  # the extractor's private temp dir
            walks.append(str(top))
        return real(top, *a, **kw)

    monkeypatch.setattr(os, "walk", spy)
    files = {f"d{i % 3}/f{i:03d}": os.urandom(100) for i in range(30)}
    blob = ANNOUNCEMENT + b"".join(reg(n, d) for n, d in files.items()) + end()
    extract(blob, tmp_path / "dst", [len(blob)])
    assert read_tree(tmp_path / "dst") == files
    assert walks == []
    # l -> s/x/../.. is the root while s does not exist; s -> . after it sends l out.
    blob = (ANNOUNCEMENT + ts.header("l", ts.SYM, linkname="s/x/../..")
            + ts.header("s", ts.SYM, linkname=".") + end())
    res = extract(blob, tmp_path / "dst2", [len(blob)])
    assert walks and not os.path.lexists(tmp_path / "dst2/l")
    assert any("'l'" in r for r in res.refused)


def test_a_file_gets_its_mode_and_time_without_a_chmod(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Created with its final mode (the container's bits minus the umask, no setuid):
    no fchmod per file; directories still get theirs at the end."""
    chmods: list[int] = []
    real = os.fchmod

    def spy(fd: int, mode: int) -> None:
        chmods.append(fd)
        real(fd, mode)

    monkeypatch.setattr(os, "fchmod", spy)
    old = os.umask(0o027)
    try:
        extract(ANNOUNCEMENT + reg("x", b"run", mode=0o4755) + reg("r", b"ro", mode=0o444)
                + end(), tmp_path / "dst", [700])
    finally:
        os.umask(old)
    x, r = os.stat(tmp_path / "dst/x"), os.stat(tmp_path / "dst/r")
    assert stat.S_IMODE(x.st_mode) == 0o750 and stat.S_IMODE(r.st_mode) == 0o440
    assert x.st_mtime_ns == 1_600_000_000_5 * 10**8
    assert len(chmods) == 1  # the root directory's, none per file


def test_a_stream_cut_inside_a_file_leaves_no_fd_and_no_tree(tmp_path: Path) -> None:
    blob = ANNOUNCEMENT + reg("a", b"x" * 5000) + reg("b", b"y" * 5000) + end()
    before = open_fds()
    with pytest.raises(TransferError, match="ended early"):
        extract(blob[:len(blob) // 2], tmp_path / "dst", [1000])
    assert open_fds() == before
    assert os.listdir(tmp_path) == []


async def test_a_cancelled_download_closes_nothing_under_its_worker(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while a worker applies a piece, the extraction waits for that call
    before closing the fds it writes through (a closed fd number can be reused by the
    next open: a late write would land in another file), then removes the temp tree."""
    from aggapi.client.extract import Extractor

    started, release = threading.Event(), threading.Event()
    order: list[str] = []
    real_feed, real_close = Extractor.feed, Extractor.close

    def slow_feed(self: Extractor, data: bytes) -> int:
        started.set()
        release.wait(10)
        n = real_feed(self, data)
        order.append("fed")
        return n

    def close(self: Extractor) -> None:
        order.append("closed")
        real_close(self)

    monkeypatch.setattr(Extractor, "feed", slow_feed)
    monkeypatch.setattr(Extractor, "close", close)
    blob = ANNOUNCEMENT + reg("a", b"x" * 3000) + end()
    task = asyncio.create_task(extract_dir(ts.TarReader(Pieces(blob, [len(blob)])),
                                           tmp_path / "dst"))
    assert await asyncio.to_thread(started.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    assert order == []  # still waiting for the worker
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert order == ["fed", "closed"]
    assert os.listdir(tmp_path) == []
