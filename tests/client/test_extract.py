"""Directory downloads cannot reach outside the destination (issue 13, finding 2).

Regression tests for each reported attack, run on :func:`extract_dir` directly,
and a property test: whatever tree of entries a container sends, every path
under the destination resolves inside it afterwards, and a sentinel directory
beside it is untouched.
"""

from __future__ import annotations

import asyncio
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggapi.client.extract import ExtractResult, extract_dir
from aggapi.tar.stream import DIR, LNK, PAX, REG, SYM, TarReader, header, pad, pax_header

# Every test on both extraction paths (the compiled loop where it is built).
pytestmark = pytest.mark.usefixtures("extract_path")


def stream(entries: bytes) -> bytes:
    done = pax_header("./", {"AGGAPI.complete": "true"}, typeflag=PAX) + header("./", DIR,
                                                                                mode=0o755)
    return entries + done + b"\0" * 1024


def reg(name: str, data: bytes = b"x", mode: int = 0o644) -> bytes:
    return header(name, REG, size=len(data), mode=mode) + data + pad(len(data))


def sym(name: str, target: str) -> bytes:
    return header(name, SYM, linkname=target)


async def extract(blob: bytes, dest: Path) -> ExtractResult:
    sr = asyncio.StreamReader()
    sr.feed_data(blob)
    sr.feed_eof()
    return await extract_dir(TarReader(sr), dest)


def present(p: Path) -> bool:
    return os.path.lexists(p)


def escapes(dest: Path) -> list[str]:
    """Paths under ``dest`` whose realpath is not inside it."""
    root = os.path.realpath(dest)
    out = []
    for cur, dirs, files in os.walk(dest):
        for n in dirs + files:
            real = os.path.realpath(os.path.join(cur, n))
            if real != root and not real.startswith(root + os.sep):
                out.append(os.path.relpath(os.path.join(cur, n), dest))
    return out


async def test_link_through_a_link_to_the_parent_is_refused(tmp_path: Path) -> None:
    # The reported case: lexically x/l1/x/l1/../../../etc/passwd stays inside, but
    # x/l1 -> .. makes every x/l1 step climb instead of descend.
    dest = tmp_path / "a" / "b" / "dest"
    dest.parent.mkdir(parents=True)
    blob = stream(header("x/", DIR) + sym("x/l1", "..")
                  + sym("passwd", "x/l1/x/l1/../../../etc/passwd"))
    res = await extract(blob, dest)
    assert escapes(dest) == []
    assert not present(dest / "passwd")
    assert os.readlink(dest / "x/l1") == ".."  # a link that stays inside is kept
    assert len(res.refused) == 1 and "'passwd'" in res.refused[0]


async def test_later_link_cannot_redirect_an_earlier_one(tmp_path: Path) -> None:
    # l is fine when written (s does not exist: s/x/../.. is the root); s -> . written
    # after it makes l climb one level above the root.
    dest = tmp_path / "p" / "dest"
    dest.parent.mkdir()
    res = await extract(stream(sym("l", "s/x/../..") + sym("s", ".")), dest)
    assert escapes(dest) == []
    assert not present(dest / "l") and (dest / "s").is_symlink()
    assert any("'l'" in r for r in res.refused)


async def test_file_replaced_by_a_symlink_is_not_hard_linked(tmp_path: Path) -> None:
    # d/e/f -> ../../t stays inside from d/e; hard-linking that symlink to the root
    # would make the same text climb two levels above it.
    dest = tmp_path / "p" / "q" / "dest"
    dest.parent.mkdir(parents=True)
    blob = stream(reg("d/e/f", b"data") + sym("d/e/f", "../../t") + header("f2", LNK,
                                                                          linkname="d/e/f"))
    res = await extract(blob, dest)
    assert escapes(dest) == []
    assert not present(dest / "f2")
    assert any("'f2'" in r for r in res.refused)


async def test_hard_link_to_a_file_written_earlier_works(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    res = await extract(stream(reg("d/f", b"data") + header("g", LNK, linkname="d/f")), dest)
    assert res.refused == []
    assert os.stat(dest / "g").st_ino == os.stat(dest / "d/f").st_ino


async def test_no_write_through_a_symlink(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    outside.mkdir()
    res = await extract(stream(sym("l", "../outside") + reg("l/x")
                               + header("s/", DIR) + sym("m", "s") + reg("m/y")), dest)
    assert os.listdir(outside) == []
    assert (dest / "l/x").is_file() and not (dest / "l").is_symlink()  # l was refused
    assert not (dest / "s/y").exists()  # even a link that stays inside is not written through
    assert len(res.refused) == 2 and "'m/y' crosses a symlink or file at 'm'" in res.refused[1]


async def test_modes_follow_the_umask_without_special_bits(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    old = os.umask(0o027)
    try:
        await extract(stream(header("d/", DIR, mode=0o3777) + reg("d/f", mode=0o6777)), dest)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(dest / "d/f").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(dest / "d").st_mode) == 0o750
    assert stat.S_IMODE(os.stat(dest).st_mode) == 0o750


async def test_last_recheck_drops_links_through_links(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Past the round limit (0 here), links whose path runs through another link go too,
    # so a hostile chain of removals cannot make the re-check quadratic.
    from aggapi.client import linkcheck as mod
    monkeypatch.setattr(mod, "RECHECK_ROUNDS", 0)
    dest = tmp_path / "dest"
    res = await extract(stream(header("d/", DIR) + reg("d/f") + sym("m", "d")
                               + sym("l", "m/f") + sym("k", "d/f")), dest)
    assert sorted(os.listdir(dest)) == ["d", "k", "m"]
    assert res.refused == ["symlink 'l' -> 'm/f' runs through another link; removed"]


def test_resolver_follows_links_on_disk(tmp_path: Path) -> None:
    from aggapi.client.confine import resolve_beneath  # here: main lacked the module

    (tmp_path / "a/b").mkdir(parents=True)
    os.symlink("a/b", tmp_path / "deep")
    os.symlink("loop", tmp_path / "loop")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert resolve_beneath(fd, [], "deep/../..") == []
        assert resolve_beneath(fd, [], "deep/../../..") is None
        assert resolve_beneath(fd, ["a"], "../deep/c") == ["a", "b", "c"]
        assert resolve_beneath(fd, [], "loop/x") is None
        assert resolve_beneath(fd, [], "/etc") is None
    finally:
        os.close(fd)


# --- property: any tree of entries stays confined -----------------------------------------

NAMES = ["a", "l", "a", "l", ".."]
name = st.lists(st.sampled_from(NAMES), min_size=1, max_size=2).map("/".join)


@st.composite
def trees(draw: st.DrawFn) -> list[tuple[str, str, str]]:
    """Entries whose link targets run through names written earlier and climb with
    '..', so links get chained through other links (the way attacks combine them)."""
    out: list[tuple[str, str, str]] = []
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["dir", "file", "sym", "sym", "sym", "hard"]))
        n = draw(name)
        seen = [e[1] for e in out] or NAMES
        if kind == "sym":
            # "<earlier name>/..": through a link, then up: what lexical checks misjudge.
            piece = st.one_of(st.sampled_from(seen), st.sampled_from(["..", "."]),
                              st.sampled_from([f"{x}/.." for x in seen]),
                              st.sampled_from(["a", "l", "sentinel"]))
            prefix = draw(st.sampled_from(["", "", "", "/", "@"]))
            pieces = draw(st.lists(piece, min_size=1, max_size=3))
            out.append((kind, n, prefix + "/".join(pieces)))
        elif kind == "hard":
            out.append((kind, n, draw(st.sampled_from([*seen, "/etc/passwd"]))))
        else:
            out.append((kind, n, ""))
    return out


def snapshot(d: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for cur, dirs, files in os.walk(d):
        for n in dirs + files:
            p = os.path.join(cur, n)
            s = os.lstat(p)
            body = os.readlink(p) if os.path.islink(p) else (
                Path(p).read_bytes() if stat.S_ISREG(s.st_mode) else b"")
            out[os.path.relpath(p, d)] = (s.st_mode, s.st_mtime_ns, s.st_nlink, body)
    return out


@settings(max_examples=400, deadline=None)
@given(trees())
@example([("sym", "a/l", ".."), ("sym", "p", "a/l/a/l/../../sentinel/a")])
@example([("sym", "l", "a/x/../.."), ("sym", "a", "."), ("file", "l/f", "")])
@example([("file", "a/l/f", ""), ("sym", "a/l/f", "../../sentinel"), ("hard", "g", "a/l/f")])
def test_any_tree_stays_inside_the_destination(entries: list[tuple[str, str, str]]) -> None:
    with tempfile.TemporaryDirectory() as base_s:
        base = Path(base_s)
        sentinel = base / "sentinel"
        (sentinel / "f").mkdir(parents=True)
        (sentinel / "a").write_bytes(b"keep")
        (base / "out").mkdir()
        dest = base / "out" / "dest"
        blob = b""
        for kind, n, t in entries:
            t = t.replace("@", str(sentinel) + "/", 1) if t.startswith("@") else t
            if kind == "dir":
                blob += header(n + "/", DIR, mode=0o755)
            elif kind == "file":
                blob += reg(n, b"payload", mode=0o4755)
            elif kind == "sym":
                blob += sym(n, t)
            else:
                blob += header(n, LNK, linkname=t)
        before = snapshot(base / "sentinel")
        asyncio.run(extract(stream(blob), dest))
        assert escapes(dest) == []
        assert snapshot(sentinel) == before
        assert sorted(os.listdir(base)) == ["out", "sentinel"]
        assert os.listdir(base / "out") == ["dest"]
        for cur, _dirs, files in os.walk(dest):
            for f in files:
                mode = os.lstat(os.path.join(cur, f)).st_mode
                assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
