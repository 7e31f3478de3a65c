"""The compiled per-file loop of a directory download's walk (aggapi.agent.copy._fastwalk,
issue 35) against the Python walk, the reference: for random trees of every kind of
entry, under random limits and id maps, the same tar byte for byte, the same counts,
skips and owed digest, the same refusal at the same point; and its one open confined
as the Python path's (O_NOFOLLOW under the walked directory, regular files only, one
link, the directory's own file system)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import fastwalk, tarwalk
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.idmap import IdMap
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.status import StatusError

pytestmark = pytest.mark.skipif(fastwalk._native is None,
                                reason="aggapi.agent.copy._fastwalk is not built")
native: Any = fastwalk._native

MiB = 1 << 20
# Around the loop's size bound (a chunk), the tar block and empty; mostly small.
SIZES = st.one_of(st.integers(0, 3000), st.sampled_from([0, 1, 511, 512, 513, MiB - 1, MiB,
                                                         MiB + 1]))
NAMES = st.one_of(st.sampled_from(["a", "b", "c", "z", "sp ace", "dé", "x" * 99, "y" * 100,
                                   "w" * 101, "v" * 200, "\udcff", "-", "0"]),
                  st.text("abcdef", min_size=1, max_size=8))
MTIMES = st.one_of(st.just(1_700_000_000 * 10**9), st.integers(0, 2**34 * 10**9),
                   st.integers(-10**12, 10**12), st.just(8**11 * 10**9 + 5))
MODES = st.sampled_from([0o644, 0o600, 0o755, 0o4755, 0o1777, 0o2750, 0o000])
KINDS = st.sampled_from(["file", "file", "file", "file", "dir", "symlink", "hardlink",
                         "fifo"])


@st.composite
def entries(draw: st.DrawFn) -> list[tuple[str, str, int, int, int]]:
    """(kind, relative path, size, mode, mtime_ns), parents before children."""
    out: list[tuple[str, str, int, int, int]] = []
    dirs = [""]
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(KINDS)
        parent = draw(st.sampled_from(dirs))
        rel = parent + draw(NAMES)
        if any(e[1] == rel for e in out):
            continue
        out.append((kind, rel, draw(SIZES), draw(MODES), draw(MTIMES)))
        if kind == "dir":
            dirs.append(rel + "/")
    return out


def make(root: Path, tree: list[tuple[str, str, int, int, int]]) -> None:
    root.mkdir()
    files: list[str] = []
    for kind, rel, size, mode, mtime in tree:
        p = root / rel
        if kind == "dir":
            p.mkdir()
        elif kind == "symlink":
            os.symlink(files[-1] if files else "nowhere", p)
        elif kind == "hardlink" and files:
            os.link(root / files[0], p)
        elif kind == "fifo":
            os.mkfifo(p)
        else:
            p.write_bytes(bytes([size % 251]) * size)
            files.append(rel)
        if kind != "symlink":
            os.chmod(p, mode if kind != "dir" else mode | 0o700)
        os.utime(p, ns=(mtime, mtime), follow_symlinks=False)
    # Directories last: their mtimes moved as entries went in.
    for kind, rel, _, _, mtime in reversed(tree):
        if kind == "dir":
            os.utime(root / rel, ns=(mtime, mtime))


def walk(root: Path, fast: bool, limits: CopyLimits, ids: IdMap
         ) -> tuple[bytes, Any, int, int, list[dict[str, str]], str | None]:
    """The tar the walk sends (up to a refusal), the refusal, counts, skips, owed."""
    fsroot = FsRoot(os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                    container_id="t", uid_map=ids, gid_map=ids)
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    w = tarwalk.TarWalker(fsroot, dfd, limits, trailing=True)
    w.fast = fast
    pieces: list[bytes] = []
    err: Any = None
    try:
        for piece in w.chunks():
            pieces.append(piece)
    except StatusError as exc:
        err = (exc.code, exc.message)
    finally:
        os.close(dfd)
        os.close(fsroot.root_fd)
    return b"".join(pieces), err, w.entries, w.size, w.skipped, w.owed


ID_MAPS = st.sampled_from([IdMap.identity(), IdMap(((0, 100000, 65536),)),
                           IdMap(((1000, 0, 1), (0, 1, 999))), IdMap(((2**21, 0, 10),))])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(tree=entries(), max_entries=st.sampled_from([100000, 3, 7]),
       size_limit=st.sampled_from([1 << 40, 5000, MiB + 10]), ids=ID_MAPS)
def test_the_same_tar_as_the_python_walk(tmp_path_factory: pytest.TempPathFactory,
                                         tree: list[tuple[str, str, int, int, int]],
                                         max_entries: int, size_limit: int, ids: IdMap) -> None:
    root = tmp_path_factory.mktemp("w") / "t"
    make(root, tree)
    limits = CopyLimits(state_dir="/x", max_entries=max_entries, size_limit=size_limit)
    assert walk(root, True, limits, ids) == walk(root, False, limits, ids)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """(start, next, piece length) of every compiled call."""
    calls: list[tuple[int, int, int]] = []
    real = fastwalk.files

    def files(walker: Any, dfd: int, dev: int, names: list[str], start: int, prefix: str
              ) -> tuple[int, bytes]:
        nxt, piece = real(walker, dfd, dev, names, start, prefix)
        calls.append((start, nxt, len(piece)))
        return nxt, piece
    monkeypatch.setattr(fastwalk, "files", files)
    return calls


def test_the_loop_takes_a_tree_of_small_files(tmp_path: Path,
                                               counted: list[tuple[int, int, int]]) -> None:
    """Not vacuous: the loop, not the Python path, sends a plain tree's files, a piece
    of about a chunk per call (bounded memory, and a step a leaving client waits out),
    and each odd entry costs one call that takes nothing."""
    tree = [("file", f"d/f{i:04d}", 4096, 0o644, 1_700_000_000 * 10**9 + i)
            for i in range(600)]
    make(tmp_path / "t", [("dir", "d", 0, 0o755, 0), *tree[:300],
                          ("symlink", "d/f0300l", 0, 0, 0), *tree[300:]])
    limits = CopyLimits(state_dir="/x", max_entries=100000)
    fast = walk(tmp_path / "t", True, limits, IdMap.identity())
    assert fast == walk(tmp_path / "t", False, limits, IdMap.identity())
    taken = sum(n - s for s, n, _ in counted)
    assert taken == 600 and any(s == n for s, n, _ in counted) and len(counted) < 20
    assert max(size for _, _, size in counted) < fastwalk.BUDGET + 8 * 1024


def test_a_walk_without_trailing_digests_or_plain_stays_python(tmp_path: Path) -> None:
    fsroot = FsRoot(os.open(tmp_path, os.O_PATH | os.O_DIRECTORY), container_id="t")
    try:
        limits = CopyLimits(state_dir="/x")
        assert not tarwalk.TarWalker(fsroot, -1, limits, trailing=False).fast
        assert not tarwalk.TarWalker(fsroot, -1, limits, trailing=True, plain=True).fast
        assert tarwalk.TarWalker(fsroot, -1, limits, trailing=True).fast
    finally:
        os.close(fsroot.root_fd)


@pytest.fixture
def odd(tmp_path: Path) -> Iterator[tuple[int, int, Path]]:
    """(dir fd, its st_dev, its path) holding one entry of each kind."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "f").write_bytes(b"data")
    (d / "big").write_bytes(b"\0" * (MiB + 1))
    (d / "two").write_bytes(b"x")
    os.link(d / "two", d / "two-again")
    os.symlink("f", d / "link")
    os.symlink("/etc/hostname", d / "abs")
    os.mkfifo(d / "fifo")
    (d / "sub").mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd, os.fstat(fd).st_dev, d
    finally:
        os.close(fd)


def test_its_open_takes_only_a_plain_regular_file(odd: tuple[int, int, Path]) -> None:
    """A symlink is never followed (O_NOFOLLOW: its O_PATH fd is the link's, not a
    regular file), a FIFO never opened for reading (it would block), a directory, a
    file with another link (the Python path keeps the link table), a big one, one on
    another file system (st_dev), a name with a slash: none is opened."""
    dfd, dev, _ = odd
    fd = native.open_regular(dfd, "f", dev)
    assert fd is not None
    try:
        assert os.read(fd, 10) == b"data" and not os.get_blocking(fd)
        assert os.get_inheritable(fd) is False and stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    for name in ("link", "abs", "fifo", "sub", "two", "big", "nope", "sub/../f", "../d/f"):
        assert native.open_regular(dfd, name, dev) is None, name
    assert native.open_regular(dfd, "f", dev + 1) is None


@pytest.mark.parametrize(("max_entries", "size_limit"), [(9, 1 << 40), (100, 4500),
                                                         (100, 5000), (9, 7000)])
def test_a_limit_passed_in_a_run_refuses_where_the_python_walk_does(
        tmp_path: Path, counted: list[tuple[int, int, int]], max_entries: int,
        size_limit: int) -> None:
    """The file that passes a limit is left to the Python walk (its 413), after the
    same bytes; the loop took the files before it. (A directory's listing is checked
    against the entry limit as a whole: the loop meets it after a subdirectory.)"""
    make(tmp_path / "t", [("dir", "a", 0, 0o755, 0),
                          *[("file", f"a/f{i}", 1000, 0o644, 10**9) for i in range(3)],
                          *[("file", f"f{i}", 1000, 0o644, 10**9) for i in range(8)]])
    limits = CopyLimits(state_dir="/x", max_entries=max_entries, size_limit=size_limit)
    fast = walk(tmp_path / "t", True, limits, IdMap.identity())
    assert fast == walk(tmp_path / "t", False, limits, IdMap.identity())
    assert fast[1] is not None and fast[1][0] == 413
    assert sum(n - s for s, n, _ in counted) == min(max_entries - 1, size_limit // 1000)
