"""Escape corpus: every case is refused, and nothing outside the container changes.

Each case runs against a plain directory used as the root and, for the cases
that need /proc, a real process in its own mount namespace chrooted into a
busybox rootfs (proc mounted inside), reached through /proc/<pid>/root.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.tar import stream as ts
from tests.agent.copy.conftest import Box, DirResolver, PidResolver, snapshot, temp_leftovers

VICTIM = b"host file, must never change"


def build_tree(root: Path, outside: Path, at: str = "/") -> None:
    """A hostile container tree around a host directory ``outside``; ``at`` is where
    ``root`` appears in the container (for the absolute link of the chain)."""
    (outside / "victim").write_bytes(VICTIM)
    (outside / "dir").mkdir(exist_ok=True)
    (root / "etc").mkdir(exist_ok=True)
    (root / "up").mkdir()
    (root / "tmp").mkdir(exist_ok=True)
    depth = len(root.parts)
    rel_out = "../" * (depth + 2) + str(outside).lstrip("/")
    os.symlink(str(outside), root / "abs_link")
    os.symlink(rel_out, root / "rel_link")
    os.symlink("chain2", root / "chain1")
    os.symlink(at.rstrip("/") + "/chain3", root / "chain2")
    os.symlink("abs_link", root / "chain3")
    os.symlink(str(outside / "victim"), root / "abs_file_link")
    os.symlink("/proc/self/root" + str(outside), root / "proc_link")
    os.link(outside / "victim", root / "hl_outside")
    os.mkfifo(root / "fifo")
    os.mknod(root / "devnull", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.symlink(str(outside), root / "up" / "pre")
    os.symlink("../..", root / "up" / "pre2")


def tar_of(*members: bytes) -> bytes:
    return b"".join(members) + ts.END


def reg(name: str, data: bytes = b"pwned") -> bytes:
    return ts.header(name, ts.REG, size=len(data)) + data + ts.pad(len(data))


def pax_reg(pax_path: str, ustar_name: str = "harmless", data: bytes = b"pwned") -> bytes:
    return ts.pax_header("PaxHeader", {"path": pax_path}, typeflag=ts.PAX) + reg(ustar_name, data)


def gnu_long(name: str) -> bytes:
    raw = name.encode() + b"\0"
    return (ts.header("././@LongLink", ts.GNU_LONGNAME, size=len(raw)) + raw + ts.pad(len(raw))
            + reg("short"))


def bad_checksum() -> bytes:
    h = bytearray(reg("ok"))
    h[0] = ord("X")
    return bytes(h)


@dataclass(frozen=True)
class Case:
    id: str
    method: str  # GET, HEAD, POST, TAR
    path: str
    body: Callable[[Path], bytes] | None = None
    expect: tuple[int, ...] = (400,)
    needs_proc: bool = False


def C(id: str, method: str, path: str, *expect: int, body: Any = None,
      proc: bool = False) -> Case:
    return Case(id, method, path, body, expect or (400,), proc)


NOT_FOUND = (404,)
CORPUS: list[Case] = [
    # Relative paths start at the process's cwd (here "/"), and their '..' stop at the
    # container root: the container's own /etc/passwd at most, never the host's.
    C("rel-get", "GET", "etc/passwd", 200, 404),
    C("rel-post", "POST", "tmp/x", 200),
    C("rel-dotdot-get", "GET", "../../etc/passwd", 200, 404),
    C("rel-dotdot-shadow", "GET", "../../../../../../../../etc/shadow", 404),
    C("rel-dotdot-post", "POST", "../../../../tmp/../../x", 200),
    C("rel-abs-link-get", "GET", "abs_link/victim", 404),
    C("rel-link-dotdot-get", "GET", "up/pre2/../abs_link/victim", 404),
    C("rel-nul-get", "GET", "etc\0/passwd"),
    # Path syntax: '..', NUL, empty, over-long.
    C("dotdot-get", "GET", "/../../../etc/passwd"),
    C("dotdot-post", "POST", "/tmp/../../x"),
    C("dotdot-middle", "POST", "/etc/../../../../tmp/x"),
    C("dotdot-slashes", "GET", "//..//..//etc/passwd"),
    C("nul-get", "GET", "/etc/passwd\0/x"),
    C("nul-post", "POST", "/tmp/x\0y"),
    C("empty-get", "GET", ""),
    C("long-name", "POST", "/tmp/" + "x" * 300),
    C("dotdot-link", "POST", "/abs_link/../x"),
    # Symlinks in the path: absolute, relative past the root, chained.
    C("abs-link-get", "GET", "/abs_link/victim", 404),
    C("abs-link-head", "HEAD", "/abs_link/victim", 404),
    C("abs-link-post", "POST", "/abs_link/new", 404),
    C("abs-link-dir-get", "GET", "/abs_link/dir", 404),
    C("rel-link-get", "GET", "/rel_link/victim", 404),
    C("rel-link-post", "POST", "/rel_link/new", 404),
    C("chain-get", "GET", "/chain1/victim", 404),
    C("chain-post", "POST", "/chain1/new", 404),
    C("chain-head", "HEAD", "/chain1/victim", 404),
    C("abs-file-link-tar-target", "TAR", "/abs_link", 409, body=lambda o: tar_of(reg("x"))),
    C("rel-link-tar-target", "TAR", "/rel_link/sub", 404, body=lambda o: tar_of(reg("x"))),
    # /proc magic links (need a real process with /proc mounted in its root).
    C("magic-self-root-get", "GET", "/proc/self/root/etc/passwd", proc=True),
    C("magic-1-root-get", "GET", "/proc/1/root/etc/passwd", 400, 403, proc=True),
    C("magic-self-cwd-post", "POST", "/proc/self/cwd/tmp/x", proc=True),
    C("magic-self-root-post", "POST", "/proc/self/root/tmp/x", proc=True),
    C("magic-fd-dir-get", "GET", "/proc/self/fd/0/x", proc=True),
    C("magic-link-symlink", "GET", "/proc_link/victim", proc=True),
    C("magic-self-root-tar", "TAR", "/proc/self/root/tmp", proc=True,
      body=lambda o: tar_of(reg("x"))),
    C("magic-thread-self", "HEAD", "/proc/thread-self/root/etc", proc=True),
    # Special files.
    C("fifo-get", "GET", "/fifo"),
    C("dev-get", "GET", "/devnull"),
    C("fifo-post", "POST", "/fifo", 409),
    C("dev-post", "POST", "/devnull", 409),
    # Tar entries.
    C("tar-dotdot", "TAR", "/up", body=lambda o: tar_of(reg("../x"))),
    C("tar-abs", "TAR", "/up", body=lambda o: tar_of(reg(str(o / "x")))),
    C("tar-dotdot-deep", "TAR", "/up", body=lambda o: tar_of(reg("a/../../../x"))),
    C("tar-dot-dotdot", "TAR", "/up", body=lambda o: tar_of(reg("./../x"))),
    C("tar-pax-dotdot", "TAR", "/up", body=lambda o: tar_of(pax_reg("../../x"))),
    C("tar-pax-abs", "TAR", "/up", body=lambda o: tar_of(pax_reg(str(o / "x")))),
    C("tar-pax-nul", "TAR", "/up", body=lambda o: tar_of(pax_reg("a\0/../../x"))),
    C("tar-gnu-long-dotdot", "TAR", "/up", body=lambda o: tar_of(gnu_long("../../x"))),
    C("tar-symlink-then-file", "TAR", "/up", body=lambda o: tar_of(
        ts.header("l", ts.SYM, linkname=str(o)), reg("l/x"))),
    C("tar-rel-symlink-then-file", "TAR", "/up", body=lambda o: tar_of(
        ts.header("l", ts.SYM, linkname="../../../../../../.."), reg("l/tmp/x"))),
    C("tar-symlink-dir-then-file", "TAR", "/up", body=lambda o: tar_of(
        ts.header("d/", ts.DIR, mode=0o755), ts.header("d/l", ts.SYM, linkname="/"),
        reg("d/l/x"))),
    C("tar-existing-symlink", "TAR", "/up", body=lambda o: tar_of(reg("pre/x"))),
    C("tar-existing-rel-symlink", "TAR", "/up", body=lambda o: tar_of(reg("pre2/x"))),
    C("tar-hardlink-outside", "TAR", "/up", body=lambda o: tar_of(
        ts.header("h", ts.LNK, linkname=str(o / "victim")))),
    C("tar-hardlink-dotdot", "TAR", "/up", body=lambda o: tar_of(
        ts.header("h", ts.LNK, linkname="../hl_outside"))),
    C("tar-hardlink-not-earlier", "TAR", "/up", body=lambda o: tar_of(
        ts.header("h", ts.LNK, linkname="pre"), reg("pre"))),
    C("tar-hardlink-to-symlink", "TAR", "/up", body=lambda o: tar_of(
        ts.header("s", ts.SYM, linkname=str(o / "victim")), ts.header("h", ts.LNK, linkname="s"))),
    C("tar-hardlink-through-symlink", "TAR", "/up", body=lambda o: tar_of(
        ts.header("h", ts.LNK, linkname="pre/victim"))),
    C("tar-chardev", "TAR", "/up", body=lambda o: tar_of(ts.header("null", ts.CHR))),
    C("tar-blockdev", "TAR", "/up", body=lambda o: tar_of(ts.header("sda", ts.BLK))),
    C("tar-fifo", "TAR", "/up", body=lambda o: tar_of(ts.header("p", ts.FIFO))),
    C("tar-bad-checksum", "TAR", "/up", body=lambda o: tar_of(bad_checksum())),
    C("tar-truncated", "TAR", "/up", body=lambda o: reg("big", b"x" * 4096)[:1024]),
    C("tar-size-lies", "TAR", "/up", body=lambda o: ts.header("f", ts.REG, size=10_000)
      + b"short" + ts.END),
    C("tar-file-as-dir", "TAR", "/up", body=lambda o: tar_of(reg("devnull_x"),
                                                                   reg("devnull_x/y"))),
]


@pytest.fixture
def corpus_limits(tmp_path: Path) -> CopyLimits:
    return CopyLimits(size_limit=1 << 20, state_dir=str(tmp_path / "state"))


async def run_case(cc: Any, case: Case, outside: Path) -> int:
    if case.method == "GET":
        r = await cc.get(case.path)
        await r.read()
    elif case.method == "HEAD":
        r = await cc.head(case.path)
    elif case.method == "POST":
        r = await cc.post(case.path, b"pwned")
    else:
        assert case.body is not None
        r = await cc.post(case.path, case.body(outside), format="tar")
    return int(r.status)


def test_corpus_is_big_enough() -> None:
    assert len(CORPUS) >= 50
    assert len({c.id for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", [c for c in CORPUS if not c.needs_proc], ids=lambda c: c.id)
async def test_escape_plain_root(case: Case, plain: tuple[Path, Path], serve: Any,
                                 corpus_limits: CopyLimits) -> None:
    root, outside = plain
    build_tree(root, outside)
    before, inside_before = snapshot(outside), snapshot(root)
    cc = await serve(DirResolver(root), corpus_limits)
    status = await run_case(cc, case, outside)
    assert status in case.expect, f"{case.id}: {status}"
    assert snapshot(outside) == before
    assert temp_leftovers(root) == []
    if case.method in ("GET", "HEAD"):
        assert snapshot(root) == inside_before


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.id)
async def test_escape_process_root(case: Case, box: Box, serve: Any,
                                   corpus_limits: CopyLimits) -> None:
    root = box.rootfs
    outside = root.parent / "outside"
    outside.mkdir()
    build_tree(root, outside)
    before = snapshot(outside)
    cc = await serve(PidResolver(box.pid), corpus_limits)
    status = await run_case(cc, case, outside)
    assert status in case.expect, f"{case.id}: {status}"
    assert snapshot(outside) == before
    assert (outside / "victim").read_bytes() == VICTIM
    assert temp_leftovers(root) == []


async def test_replacing_links_never_writes_through_them(plain: tuple[Path, Path], serve: Any,
                                                         corpus_limits: CopyLimits) -> None:
    """Uploading onto a symlink or a hard link to a host file replaces the name only."""
    root, outside = plain
    build_tree(root, outside)
    cc = await serve(DirResolver(root), corpus_limits)
    for path in ("/abs_file_link", "/hl_outside"):
        r = await cc.post(path, b"new")
        assert r.status == 200
        assert (root / path.lstrip("/")).read_bytes() == b"new"
    assert (outside / "victim").read_bytes() == VICTIM
    assert not (root / "abs_file_link").is_symlink()
