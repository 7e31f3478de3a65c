"""The agent's compiled upload loop (aggapi.agent.copy.fastuntar) against its reference,
the Python TarSink: on random and hostile tar streams, cut anywhere and received in
pieces, both give the same tree (names, types, modes, owners, times, data), the same
sink figures, and the same refusal (type, text and Status code).

Run with ``-s`` to see how many cases ran and how many entries the loop applied.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import fastuntar, untar
from aggapi.agent.copy.atomic import Owner
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.untar import TarSink
from aggapi.agent.copy.uploadparams import UploadParams
from aggapi.status import StatusError
from aggapi.tar.entrydigest import ANNOUNCEMENT
from aggapi.tar.stream import END, header, pax_header
from tests import tarcraft as tc
from tests.agent.copy.conftest import extract_tar

pytestmark = pytest.mark.skipif(not fastuntar.loaded(),
                                reason="the compiled loop is not built here "
                                       "(python3 setup.py build_ext --inplace)")

SEEN = {"cases": 0, "taken": 0}
DIRS = ["", "d", "d/e"]
LEAVES = ["a", "b", "c", "ü", "GNUSparseFile.1", "x" * 255, "y" * 256, ".", "..", ""]
MTIMES = [1_700_000_000 * 10**9, 1_700_000_000 * 10**9 + 123_456_789, 0, -5 * 10**9]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@st.composite
def plain_file(draw: st.DrawFn) -> bytes:
    """A regular file as ncp writes it, now and then with one thing wrong."""
    parent = draw(st.sampled_from(["d"] * 10 + DIRS))  # runs in one directory, mostly
    leaf = draw(st.integers(0, 40).map("f{}".format) if draw(st.integers(0, 15)) else
                st.sampled_from(LEAVES))
    name = f"{parent}/{leaf}" if parent else leaf
    data = draw(st.binary(max_size=700)) if draw(st.integers(0, 3)) else b""
    digest = draw(st.sampled_from(["ok"] * 40 + ["wrong", "upper", "short", "none"]))
    recs = {"ok": {"AGGAPI.sha256": _sha(data)}, "wrong": {"AGGAPI.sha256": _sha(b"?")},
            "upper": {"AGGAPI.sha256": _sha(data).upper()},
            "short": {"AGGAPI.sha256": _sha(data)[:63]}, "none": {}}[digest]
    extra = draw(st.sampled_from([{}] * 30 + [{"comment": "hi"},
                                             {"AGGAPI.previousSha256": _sha(b"")}]))
    mode = draw(st.sampled_from([0o644, 0o600, 0o755, 0o4755, 0o1777, 0o7777]))
    return header(name, b"0", size=len(data), mode=mode, mtime_ns=draw(st.sampled_from(MTIMES)),
                  records={**recs, **extra}) + data + b"\0" * (-len(data) % 512)


@st.composite
def odd_entry(draw: st.DrawFn) -> bytes:
    """Anything else: directories, links, crafted headers, odd names and types."""
    kind = draw(st.sampled_from(["dir", "sym", "hard", "craft", "dotname", "pathrec",
                                 "global", "type7"]))
    parent = draw(st.sampled_from(DIRS))
    leaf = draw(st.sampled_from(LEAVES[:3]))
    name = f"{parent}/{leaf}" if parent else leaf
    if kind == "dir":
        return header(name + "/", b"5", mode=draw(st.sampled_from([0o755, 0o700])))
    if kind == "sym":
        return header(name, b"2", linkname=draw(st.sampled_from(["a", "/etc", "../x"])))
    if kind == "hard":
        return header(name, b"1", linkname=draw(st.sampled_from(["a", "d/a", "nope"])))
    if kind == "global":
        return pax_header("g", draw(st.sampled_from([{"comment": "x"}, {"path": "z"}])))
    data = b"q" * draw(st.integers(0, 600))
    if kind == "type7":
        return header(name, b"7", size=len(data), records={"AGGAPI.sha256": _sha(data)}) \
            + tc.padded(data)
    if kind == "dotname":
        name = draw(st.sampled_from(["./" + name, name.replace("/", "//"), "/" + name,
                                     "d/../" + leaf]))
        return header(name, b"0", size=len(data), records={"AGGAPI.sha256": _sha(data)}) \
            + tc.padded(data)
    if kind == "pathrec":  # a name only a PAX path record can carry
        bad = draw(st.sampled_from([name + "\0z", name + "/", "d/" + "n" * 256]))
        return tc.pax([(b"path", bad.encode()), (b"AGGAPI.sha256", _sha(data).encode())]) \
            + tc.block(b"x", b"0", len(data)) + tc.padded(data)
    fields = draw(st.sampled_from([{"mtime": b" 1234567 \0"}, {"mtime": b"\x80" + b"\0" * 11},
                                   {"devmajor": tc.octal(1, 8)}, {"prefix": b"d"},
                                   {"typeflag": b"\0"}, {"mode": b"0000644 "}]))
    return tc.pax([(b"AGGAPI.sha256", _sha(data).encode())]) \
        + tc.block(name.encode(), b"0", len(data), fields) + tc.padded(data)


@st.composite
def stream(draw: st.DrawFn) -> bytes:
    runs = st.lists(plain_file(), min_size=2, max_size=30).map(b"".join)
    members = draw(st.lists(st.one_of(runs, runs, odd_entry()), max_size=5))
    head = ANNOUNCEMENT if draw(st.integers(0, 5)) else b""
    raw = head + b"".join(members) + END
    cut = draw(st.sampled_from(["none"] * 10 + ["cut", "flip"]))
    if cut == "cut" and raw:
        raw = raw[:draw(st.integers(0, len(raw) - 1))]
    elif cut == "flip" and raw:
        i = draw(st.integers(0, len(raw) - 1))
        raw = raw[:i] + bytes([raw[i] ^ draw(st.integers(1, 255))]) + raw[i + 1:]
    return raw


def tree(path: Path) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            s = os.lstat(p)
            what: Any = os.readlink(p) if stat.S_ISLNK(s.st_mode) else (
                Path(p).read_bytes() if stat.S_ISREG(s.st_mode) else None)
            key = os.path.relpath(p, path)
            mtime = s.st_mtime_ns if stat.S_ISREG(s.st_mode) else None  # (others: now)
            out[key] = (stat.S_IFMT(s.st_mode), stat.S_IMODE(s.st_mode), s.st_uid, s.st_gid,
                        s.st_nlink, mtime, what)
    return out


def outcome(base: Path, raw: bytes, limits: dict[str, int], chunk: int, pieces: int,
            headers: bool, fast: bool, params: UploadParams | None = None) -> tuple[Any, ...]:
    """The tree, sink figures and refusal of one extraction, by one path."""
    root = base / ("fast" if fast else "py")
    (root / "keep").mkdir(parents=True)
    lim = CopyLimits(state_dir=str(base / f"state-{fast}"), **limits)
    want = None
    if headers:
        try:
            want = tc.headers_digest(raw)
        except Exception:  # not a tar tarfile reads: any digest, both paths alike
            want = "0" * 64
    try:
        sink: TarSink = extract_tar(root, raw, lim, chunk=chunk, pieces=pieces,
                                    headers_digest=want, fast=fast, params=params)
        result: tuple[Any, ...] = ("ok", sink.entries, sink.size, sink.hash.hexdigest(),
                                   sink.ex.ops, sorted(sink.ex.files))
    except (StatusError, ValueError, OSError) as exc:
        code = exc.code if isinstance(exc, StatusError) else None
        result = (type(exc).__name__, str(exc), code, getattr(exc, "errno", None))
    return result, tree(root)


def _counting(note: Callable[[int], None]) -> Callable[..., int]:
    """FastUntar.run that also passes ``note`` the entries each call applied."""
    real = fastuntar.FastUntar.run

    def counted(self: fastuntar.FastUntar, data: bytes, pos: int) -> int:
        before = self.taken
        try:
            return real(self, data, pos)
        finally:
            note(self.taken - before)
    return counted


@pytest.fixture(scope="module", autouse=True)
def report() -> Iterator[None]:
    """Counts the entries the loop applied, refused streams' too (the loop must run)."""
    def note(n: int) -> None:
        SEEN["taken"] += n

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fastuntar.FastUntar, "run", _counting(note))
        yield
    print(f"\ncompiled upload loop: {SEEN}")
    if SEEN["cases"]:
        assert SEEN["taken"] > SEEN["cases"], "the random streams hardly reach the loop"


@settings(max_examples=250, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stream(), st.sampled_from([100, 512, 1500, 4096, 9000] + [1 << 20] * 5), st.integers(1, 3),
       st.sampled_from([{}] * 4 + [{"max_entries": 7}, {"max_depth": 1},
                                   {"size_limit": 300}]),
       st.integers(0, 3).map(lambda n: n == 0))
def test_compiled_and_python_paths_agree(raw: bytes, chunk: int, pieces: int,
                                         limits: dict[str, int], headers: bool) -> None:
    SEEN["cases"] += 1
    base = Path(tempfile.mkdtemp(prefix="fastuntar-"))
    try:
        py = outcome(base, raw, limits, chunk, pieces, headers, fast=False)
        fast = outcome(base, raw, limits, chunk, pieces, headers, fast=True)
        assert fast == py
    finally:
        shutil.rmtree(base)


def test_the_loop_takes_nearly_every_file_of_a_plain_tree(tmp_path: Path) -> None:
    """ncp's stream of a tree of small files: the loop applies all but one entry in 32
    (those TarSink polls the container before) and the first of each directory."""
    body = b"".join(header(f"d{i // 50}/f{i}", b"0", size=5, mtime_ns=10**18,
                           records={"AGGAPI.sha256": _sha(b"%05d" % i)}) + tc.padded(b"%05d" % i)
                    for i in range(200))
    lim = CopyLimits(state_dir=str(tmp_path / "state"))
    sink = extract_tar(tmp_path, ANNOUNCEMENT + body + END, lim, chunk=1 << 20, pieces=7)
    assert sink.fast is not None and sink.entries == 200
    assert sink.fast.taken >= 200 - 200 // 32 - 4 - 7, sink.fast.taken
    assert (tmp_path / "dst/d3/f199").read_bytes() == b"00199"


def test_the_switch_turns_the_loop_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fastuntar.ENV, "1")
    assert not fastuntar.loaded()
    assert fastuntar.describe().startswith("tar uploads: python (AGGAPI_PURE_PYTHON is set)")
    body = header("f", b"0", size=1, records={"AGGAPI.sha256": _sha(b"1")}) + tc.padded(b"1")
    sink = extract_tar(tmp_path, ANNOUNCEMENT + body + END,
                       CopyLimits(state_dir=str(tmp_path / "state")))
    assert sink.fast is None and (tmp_path / "dst/f").read_bytes() == b"1"


def _file(name: str, data: bytes = b"data", **kw: Any) -> bytes:
    recs = kw.pop("records", {"AGGAPI.sha256": _sha(data)})
    return header(name, b"0", size=len(data), records=recs, **kw) + tc.padded(data)


def _pathrec(path: bytes, data: bytes = b"data") -> bytes:
    return tc.pax([(b"path", path), (b"AGGAPI.sha256", _sha(data).encode())]) \
        + tc.block(b"d/other", b"0", len(data)) + tc.padded(data)


# One oddity in a run of plain files of d/ (it comes where the loop runs: the entries
# before it are the loop's), each compared on both paths.
ODD: dict[str, bytes] = {
    "plain": _file("d/x"),
    "wrong sha256": _file("d/x", records={"AGGAPI.sha256": _sha(b"other")}),
    "upper-case sha256": _file("d/x", records={"AGGAPI.sha256": _sha(b"data").upper()}),
    "short sha256": _file("d/x", records={"AGGAPI.sha256": _sha(b"data")[:63]}),
    "no sha256": _file("d/x", records={}),
    "previousSha256": _file("d/x", records={"AGGAPI.sha256": _sha(b"data"),
                                            "AGGAPI.previousSha256": _sha(b"")}),
    "comment record": _file("d/x", records={"AGGAPI.sha256": _sha(b"data"), "comment": "c"}),
    "size record": _file("d/x", records={"AGGAPI.sha256": _sha(b"da"), "size": "2"}),
    "uid record": _file("d/x", records={"AGGAPI.sha256": _sha(b"data"), "uid": "7"}),
    "setuid, sticky": _file("d/x", mode=0o7777),
    "mtime fraction": _file("d/x", mtime_ns=1_700_000_000_123_456_789),
    "mtime before 1970": _file("d/x", mtime_ns=-1_500_000_000),
    "empty file": _file("d/x", b""),
    "NUL in path": _pathrec(b"d/x\0y"),
    "path record": _pathrec(b"d/long-" + b"n" * 200),
    "255-byte name": _pathrec(b"d/" + b"n" * 255),
    "256-byte name": _pathrec(b"d/" + b"n" * 256),
    "non-UTF-8 name": _pathrec(b"d/\xff\xfe"),
    "leaf ..": _pathrec(b"d/.."),
    "leaf .": _pathrec(b"d/."),
    "empty leaf": _pathrec(b"d/"),
    "./d/x": _file("./d/x"),
    "d//x": _file("d//x"),
    "other dir": _file("e/x"),
    "subdir": _file("d/s/x"),
    "GNUSparseFile.": _file("d/GNUSparseFile.1"),
    "a file again": _file("d/f1", b"again"),
    "a file over a dir": _file("d/s", b"x") + _file("d/s/y"),
    "dir entry": header("d/s/", b"5"),
    "symlink": header("d/l", b"2", linkname="f1"),
    "hard link": header("d/h", b"1", linkname="d/f1"),
    "type 7": header("d/x", b"7", size=4, records={"AGGAPI.sha256": _sha(b"data")})
    + tc.padded(b"data"),
    "type NUL": tc.pax([(b"AGGAPI.sha256", _sha(b"data").encode())])
    + tc.block(b"d/x", b"\0", 4) + tc.padded(b"data"),
    "prefix field": tc.pax([(b"AGGAPI.sha256", _sha(b"data").encode())])
    + tc.block(b"x", b"0", 4, {"prefix": b"d"}) + tc.padded(b"data"),
    "device fields": tc.pax([(b"AGGAPI.sha256", _sha(b"data").encode())])
    + tc.block(b"d/x", b"0", 4, {"devmajor": tc.octal(1, 8)}) + tc.padded(b"data"),
    "space-padded mtime": tc.pax([(b"AGGAPI.sha256", _sha(b"data").encode())])
    + tc.block(b"d/x", b"0", 4, {"mtime": b" 1234567 \0"}) + tc.padded(b"data"),
    "bad checksum": tc.block(b"d/x", b"0", 4, checksum=False) + tc.padded(b"data"),
    "big file": _file("d/x", b"b" * 3000),
    "cut": _file("d/x", b"c" * 2000)[:1500],
}


@pytest.mark.parametrize("headers", [False, True], ids=["whole", "headers"])
@pytest.mark.parametrize("limits", [{}, {"max_entries": 5}, {"size_limit": 1000}],
                         ids=["no-limit", "5-entries", "1000-bytes"])
@pytest.mark.parametrize("odd", list(ODD), ids=list(ODD))
def test_one_oddity_in_a_run(odd: str, limits: dict[str, int], headers: bool,
                             tmp_path: Path) -> None:
    run = b"".join(_file(f"d/f{i}", b"%d" % i * 50) for i in range(4))
    raw = ANNOUNCEMENT + run + ODD[odd] + _file("d/z") + END
    if odd == "no sha256" and not headers:
        raw = raw[len(ANNOUNCEMENT):]  # an older ncp's stream: no record needed
    params = UploadParams(owner=Owner(uid=1234, gid=5678)) if limits else None
    py = outcome(tmp_path, raw, limits, 1 << 20, 3, headers, False, params)
    before = SEEN["taken"]
    fast = outcome(tmp_path, raw, limits, 1 << 20, 3, headers, True, params)
    assert fast == py
    assert SEEN["taken"] - before >= 3  # the run before the oddity went the loop's way


def test_the_container_is_polled_as_often(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TarSink checks the container is alive every 32 entries and hands the GIL over:
    the loop stops before each such entry, so both happen as often on both paths."""
    calls = {"alive": 0, "pause": 0}
    monkeypatch.setattr(FsRoot, "ensure_alive",
                        lambda self: calls.__setitem__("alive", calls["alive"] + 1))
    monkeypatch.setattr(untar.TarSink.__init__, "__defaults__",
                        (None, lambda: calls.__setitem__("pause", calls["pause"] + 1)))
    raw = ANNOUNCEMENT + b"".join(_file(f"d/f{i}") for i in range(200)) + END
    seen = []
    for fast in (False, True):
        calls.update(alive=0, pause=0)
        (tmp_path / str(fast)).mkdir()
        sink = extract_tar(tmp_path / str(fast), raw, CopyLimits(state_dir=str(tmp_path / "s")),
                           fast=fast, pieces=5)
        assert sink.entries == 200 and (sink.fast is not None) == fast
        seen.append(dict(calls))
    assert seen[0] == seen[1] and seen[0]["alive"] >= 200 // 32


@pytest.mark.parametrize("kib", [64, 200])
def test_a_full_file_system_fails_alike(tmp_path: Path, kib: int) -> None:
    """A write the kernel refuses mid-run (ENOSPC on a small tmpfs): the same error, and
    nothing left, both ways."""
    raw = ANNOUNCEMENT + b"".join(_file(f"d/f{i}", b"z" * 4000) for i in range(60)) + END
    seen = []
    for fast in (False, True):
        mnt = tmp_path / str(fast)
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(mnt)],
                           capture_output=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        try:
            seen.append(outcome(mnt, raw, {}, 1 << 20, 2, False, fast))
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    assert seen[0] == seen[1]
    assert seen[0][0][0] == "OSError" and seen[0][0][3] == errno.ENOSPC, seen[0][0]


async def test_the_agent_takes_the_loop_for_a_new_target(cc: Any, plain: tuple[Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The upload handler's TarSink runs the loop (a new target), not only the tests'."""
    taken: list[int] = []
    monkeypatch.setattr(fastuntar.FastUntar, "run", _counting(taken.append))
    raw = ANNOUNCEMENT + b"".join(_file(f"d/f{i}", b"%d" % i) for i in range(100)) + END
    r = await cc.post("/new", raw, format="tar")
    assert r.status == 200, await r.text()
    assert sum(taken) >= 90
    assert (plain[0] / "new/d/f99").read_bytes() == b"99"
