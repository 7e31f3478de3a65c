"""A tar upload into a target that does not exist yet is built in a private directory
beside it and published by one rename (issue 27 item 3): nothing is seen at the target
until the whole tree is checked and durable, no rename per file, and a failure or an
agent killed mid-upload leaves nothing behind once the crash clean-up ran."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import cleanup
from aggapi.agent.copy import openat2 as o2
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.tarextract import target_mode
from aggapi.agent.copy.workers import Workers
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from tests.agent.copy.conftest import DirResolver, extract_tar, snapshot, temp_leftovers

REPO = Path(__file__).resolve().parents[3]


def tree_tar(n: int, size: int = 8192) -> bytes:
    """``n`` files of ``size`` bytes in directories of 10, with their AGGAPI.sha256, as
    the client packs them."""
    out = [ANNOUNCEMENT]
    for i in range(n):
        if i % 10 == 0:
            out.append(ts.header(f"d{i // 10}/", ts.DIR, mode=0o750))
        data = i.to_bytes(4, "big") * (size // 4)
        out += [ts.header(f"d{i // 10}/f{i}", ts.REG, size=size, mode=0o640,
                          records=record(hashlib.sha256(data).hexdigest())),
                data, ts.pad(size)]
    return b"".join(out) + ts.END


@dataclass
class SplitBody:
    """``data`` in two parts: the first, then (after ``release``) the rest."""

    data: bytes
    cut: int
    sent: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.data[:self.cut]
        self.sent.set()
        await self.release.wait()
        yield self.data[self.cut:]


def _files_below(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


@pytest.fixture
def renames(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The new names of every renameat2 the agent makes."""
    seen: list[str] = []
    real = o2.renameat2

    def rename(*a: Any) -> None:
        seen.append(a[3])
        real(*a)

    monkeypatch.setattr(o2, "renameat2", rename)
    yield seen


async def test_a_new_target_appears_whole_by_one_rename(
        cc: Any, plain: tuple[Path, Path], renames: list[str]) -> None:
    root = plain[0]
    raw = tree_tar(400)  # 3.5 MiB: the agent extracts in batches of about a MiB
    body = SplitBody(raw, len(raw) // 2)
    req = asyncio.ensure_future(cc.post("/dst", body.chunks(), format="tar"))
    await body.sent.wait()
    # Wait until the agent wrote files of the first half, wherever it puts them.
    deadline = time.monotonic() + 20
    while _files_below(root) < 50:
        assert time.monotonic() < deadline, "the agent wrote nothing of the first half"
        await asyncio.sleep(0.01)
    # Mid-way: nothing at the target; the tree grows in one private directory.
    assert not (root / "dst").exists()
    [private] = os.listdir(root)
    assert private.startswith(cleanup.TMP_PREFIX)
    assert stat.S_IMODE((root / private).stat().st_mode) == 0o700
    body.release.set()
    r = await req
    assert r.status == 200, await r.text()
    assert os.listdir(root) == ["dst"]
    assert renames == ["dst"]  # one rename published the tree: none per file
    got = snapshot(root / "dst")
    assert len([v for v in got.values() if v != "dir"]) == 400
    assert stat.S_IMODE((root / "dst").stat().st_mode) == target_mode()
    assert temp_leftovers(root) == []


async def test_a_refused_entry_leaves_no_target_and_no_private_tree(
        cc: Any, plain: tuple[Path, Path], limits: CopyLimits) -> None:
    root = plain[0]
    good = tree_tar(30)[:-len(ts.END)]
    raw = good + ts.header("d0/fifo", ts.FIFO) + ts.END
    r = await cc.post("/dst", raw, format="tar")
    assert r.status == 400, await r.text()
    assert os.listdir(root) == []
    assert os.listdir(limits.state_dir) == []


async def test_a_refused_new_target_leaves_no_record(
        cc: Any, plain: tuple[Path, Path], limits: CopyLimits,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The private directory's name is recorded before it is made: a refused mkdir (a
    user's read-only directory, a read-only mount) must close that record too."""
    def refused(*a: Any, **kw: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "mkdir", refused)
    r = await cc.post("/dst", tree_tar(3), format="tar")
    assert r.status == 403, await r.text()
    assert os.listdir(plain[0]) == []
    assert os.listdir(limits.state_dir) == []


async def test_a_target_made_meanwhile_is_not_replaced(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root = plain[0]
    raw = tree_tar(400)
    body = SplitBody(raw, len(raw) // 2)
    req = asyncio.ensure_future(cc.post("/dst", body.chunks(), format="tar"))
    await body.sent.wait()
    deadline = time.monotonic() + 20
    while not os.listdir(root):  # the agent has begun: its private tree is there
        assert time.monotonic() < deadline, "the upload did not start"
        await asyncio.sleep(0.01)
    (root / "dst").mkdir()
    (root / "dst" / "theirs").write_bytes(b"theirs")
    body.release.set()
    r = await req
    assert r.status == 409, await r.text()
    assert os.listdir(root) == ["dst"] and os.listdir(root / "dst") == ["theirs"]


# An agent killed mid-upload: upload_tar in a child that dies (os._exit) once half the
# tar was extracted, so no rollback and no finally runs.
CRASH = textwrap.dedent("""
    import asyncio, os, sys
    from aggapi.agent.copy.quotas import CopyLimits
    from aggapi.agent.copy.state import CopyState
    from aggapi.agent.copy.upload import upload_tar
    from aggapi.agent.copy.uploadparams import UploadParams
    from aggapi.agent.copy.workers import Workers
    from tests.agent.copy.conftest import DirResolver

    root_dir, state_dir, tar = sys.argv[1:]
    raw = open(tar, "rb").read()

    class Dying:
        def __init__(self):
            self.at = 0
        async def read(self, n):
            if self.at >= len(raw) // 2:
                await asyncio.sleep(1)  # the workers extract what they were handed
                os._exit(9)
            piece = raw[self.at:self.at + 65536]
            self.at += len(piece)
            return piece

    async def main():
        resolver = DirResolver(__import__("pathlib").Path(root_dir))
        state = CopyState(CopyLimits(state_dir=state_dir), resolver, workers=Workers(2))
        await upload_tar(state, resolver.open(), "/dst", Dying(), len(raw), UploadParams())

    asyncio.run(main())
""")


def test_a_killed_upload_leaves_nothing_after_the_clean_up(tmp_path: Path) -> None:
    root, state_dir, tar = tmp_path / "root", tmp_path / "state", tmp_path / "t.tar"
    root.mkdir()
    state_dir.mkdir()
    tar.write_bytes(tree_tar(400))
    p = subprocess.run([sys.executable, "-c", CRASH, str(root), str(state_dir), str(tar)],
                       cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, timeout=60)
    assert p.returncode == 9, p.stderr.decode()
    assert _files_below(root) >= 20  # the child did extract a part before it died
    assert len(os.listdir(state_dir)) == 1  # its in-flight record
    workers = Workers(2)
    try:
        done = asyncio.run(cleanup.cleanup_stale(str(state_dir), DirResolver(root).by_id,
                                                 workers))
    finally:
        workers.shutdown()
    assert done.removed >= 1 and done.pending == set()
    assert os.listdir(root) == []  # neither a target nor a private tree
    assert os.listdir(state_dir) == []


def test_a_private_tree_nested_deeper_than_the_recursion_limit_is_removed(
        tmp_path: Path) -> None:
    top = tmp_path / "top"
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.mkdir(top)
        d = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        for _ in range(sys.getrecursionlimit() + 50):
            os.mkdir("n", dir_fd=d)
            os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=d))
            os.chmod("n", 0o500, dir_fd=d)  # read-only, as a tar may leave a directory
            nd = os.open("n", os.O_RDONLY | os.O_DIRECTORY, dir_fd=d)
            os.close(d)
            d = nd
        os.symlink(str(tmp_path), "out", dir_fd=d)
        os.close(d)
        cleanup.remove_tree(fd, "top")
        cleanup.remove_tree(fd, "top")  # gone already: nothing to do
    finally:
        os.close(fd)
    assert os.listdir(tmp_path) == []


# --- a new target gets what an existing empty one gets --------------------------------

MODES = st.sampled_from([0o700, 0o750, 0o755, 0o775, 0o555, 0o1777])
FMODES = st.sampled_from([0o600, 0o640, 0o644, 0o755, 0o4755, 0o2755, 0o444])
NAMES = st.sampled_from(["a", "b", "c"])


@st.composite
def trees(draw: st.DrawFn) -> bytes:
    """A tar of directories (with modes) and files (with modes, mtimes and digests),
    symlinks and hard links, names drawn from a small set so that entries repeat."""
    buf = io.BytesIO()
    files: list[str] = []
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for _ in range(draw(st.integers(1, 12))):
            name = "/".join(draw(st.lists(NAMES, min_size=1, max_size=3)))
            kind = draw(st.sampled_from(["dir", "file", "file", "sym", "link"]))
            info = tarfile.TarInfo(name)
            info.mtime = draw(st.integers(0, 2_000_000_000))
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, draw(MODES) | 0o700
                tf.addfile(info)
            elif kind == "file":
                data = draw(st.binary(max_size=64))
                info.size, info.mode = len(data), draw(FMODES)
                info.pax_headers = record(hashlib.sha256(data).hexdigest())
                tf.addfile(info, io.BytesIO(data))
                files.append(name)
            elif kind == "sym":
                info.type, info.linkname = tarfile.SYMTYPE, draw(NAMES)
                tf.addfile(info)
            elif files:
                info.type, info.linkname = tarfile.LNKTYPE, draw(st.sampled_from(files))
                tf.addfile(info)
    return buf.getvalue()


def _outcome(root_dir: Path, raw: bytes) -> tuple[str, dict[str, tuple[Any, ...]]]:
    try:
        extract_tar(root_dir, raw, CopyLimits(state_dir=str(root_dir.parent / "state")))
    except Exception as exc:
        result = f"{type(exc).__name__}:{getattr(exc, 'code', '')}"
    else:
        result = "ok"
    seen: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root_dir / "dst"):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            s = os.lstat(p)
            data = Path(p).read_bytes() if stat.S_ISREG(s.st_mode) else os.readlink(p) \
                if stat.S_ISLNK(s.st_mode) else b""
            seen[os.path.relpath(p, root_dir)] = (s.st_mode, s.st_uid, s.st_gid, data,
                                                  s.st_mtime_ns if stat.S_ISREG(s.st_mode)
                                                  else 0, s.st_nlink)
    return result, seen


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(trees())
def test_a_new_target_ends_as_an_existing_empty_one_would(tmp_path: Path, raw: bytes) -> None:
    """Same outcome (ok or the same refusal), and on success the same names, contents,
    modes, owners, mtimes and links as the per-file path into an existing directory; the
    new target's own mode is a plain mkdir's."""
    base = Path(os.path.join(tmp_path, os.urandom(6).hex()))
    new, old = base / "new", base / "old"
    new.mkdir(parents=True)
    (old / "dst").mkdir(parents=True)
    os.chmod(old / "dst", target_mode())
    got_new, got_old = _outcome(new, raw), _outcome(old, raw)
    assert got_new[0] == got_old[0]
    if got_new[0] == "ok":
        assert got_new[1] == got_old[1]
        assert stat.S_IMODE((new / "dst").stat().st_mode) == target_mode()
        assert temp_leftovers(new) == []
    else:
        assert os.listdir(new) == []
