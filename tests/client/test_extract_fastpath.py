"""The compiled extraction loop (aggapi.client.fastpath, issue 35 item 6) is the Python
extractor, only faster: on random and hostile streams, cut anywhere, both give the same
tree (names, types, modes, times, data, link targets), the same refusals and counts, the
same digest state, and the same error (type and message)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.client import fastpath
from aggapi.client.errors import IntegrityError
from aggapi.client.extractor import Extractor
from aggapi.client.linkcheck import recheck_links
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, TRAILING_ANNOUNCEMENT
from aggapi.tar.parse import TarError, TarLimits, TarParser

pytestmark = pytest.mark.skipif(not fastpath.loaded(), reason="the compiled loop is not built")

# Mostly plain files in a few directories (what the compiled loop takes), some of them
# twice; now and then a hostile or unusual entry, record or byte.
PLAIN = [f"{d}f{i}" for d in ("", "d/", "d/e/") for i in range(4)]
ODD = ["d//f7", "./d/f8", "d/./f9", "../x", "/abs", "d/../y", "d/" + "n" * 120,
       "d/\u00e9t\u00e9", "d/GNUSparseFile.1/z", "s/in", "d", "d/e", "e/f\0x",
       "d/" + "m" * 300, "d/f0/g", "d/.", "d/.."]
MODES = st.sampled_from([0o644, 0o600, 0o755, 0o4755, 0o7777, 0])
MTIMES = st.sampled_from([0, 1_600_000_000 * 10**9, 1_700_000_000_123_456_789, 5 * 10**8,
                          -1_500_000_000, 2**62, 1_700_000_000_100_000_000])


def often(common: Any, *rare: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from([common] * (4 * len(rare)) + list(rare))


@st.composite
def entry(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(often("reg", "dir", "sym", "lnk", "fifo"))
    name = draw(st.sampled_from(PLAIN * 3 + ODD))
    return {"kind": kind, "name": name, "mode": draw(MODES), "mtime": draw(MTIMES),
            "data": draw(st.binary(max_size=2000)),
            "digest": draw(often("right", "wrong", "none", "bad", "right", "right")),
            "link": draw(st.sampled_from(["d/f1", "f0", "../out", "/etc", "d", "s"])),
            "extra": draw(often(None, {"uid": "5"}, {"comment": "x"}, {"mtime": "1.5.5"},
                                {"size": "3"}, {"mtime": "7"}, {"path": "d/f3"}, None, None,
                                None, None, None, None))}


@st.composite
def runs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Entries, mostly in runs of files in one directory (as a tree walk sends them)."""
    out: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            out.append(draw(entry()))
            continue
        d = draw(st.sampled_from(["", "d/", "d/e/"]))
        for i in draw(st.lists(st.integers(0, 9), max_size=10)):
            e = draw(entry())
            e["kind"], e["name"] = "reg", f"{d}f{i}"
            out.append(e)
    return out


def build(entries: list[dict[str, Any]], mode: str, corrupt: int | None) -> bytes:
    """The stream an agent would send (``mode``: sha256, sha256-next or none), with the
    entries' wrong or missing records, and one byte changed at ``corrupt`` if given."""
    out = [{"sha256": ANNOUNCEMENT, "sha256-next": TRAILING_ANNOUNCEMENT, "none": b""}[mode]]
    owed: str | None = None
    for e in entries:
        data = e["data"] if e["kind"] == "reg" else b""
        good = hashlib.sha256(data).hexdigest()
        digest = {"right": good, "wrong": "0" * 64, "none": None, "bad": "XYZ"}[e["digest"]]
        recs: dict[str, str] = dict(e["extra"] or {})
        if mode == "sha256-next":
            if owed is not None and digest is not None:
                recs["AGGAPI.previousSha256"] = owed if e["digest"] == "right" else digest
            owed = good if e["kind"] == "reg" else None
        elif e["kind"] == "reg" and digest is not None and mode == "sha256":
            recs["AGGAPI.sha256"] = digest
        typeflag = {"reg": ts.REG, "dir": ts.DIR, "sym": ts.SYM, "lnk": ts.LNK,
                    "fifo": ts.FIFO}[e["kind"]]
        out.append(ts.header(e["name"], typeflag, size=len(data), mode=e["mode"],
                             mtime_ns=e["mtime"], linkname=e["link"], records=recs))
        out.append(data + ts.pad(len(data)))
    closing = {"AGGAPI.complete": "true"}
    if owed is not None:
        closing["AGGAPI.previousSha256"] = owed
    out.append(ts.pax_header("./PaxHeader", closing, typeflag=ts.PAX))
    out.append(ts.header("./", ts.DIR, mode=0o755) + ts.END)
    blob = bytearray(b"".join(out))
    if corrupt is not None:
        blob[corrupt % len(blob)] ^= 0x11
    return bytes(blob)


def tree(root: Path, times: bool) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for cur, dirs, files in os.walk(root):
        for n in dirs + files:
            p = Path(cur) / n
            st_ = p.lstat()
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("l", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("d", st_.st_mode)
            else:
                out[rel] = ("f", st_.st_mode, st_.st_mtime_ns if times else 0, st_.st_nlink,
                            p.read_bytes())
    return out


def run(blob: bytes, cuts: list[int], fast: bool, where: Path,
        limits: TarLimits, views: bool = False) -> tuple[Any, ...]:
    """``views``: each piece a view of one receive buffer, as a body taken over from
    aiohttp is fed (aggapi.serve.bodyreceiver), not bytes."""
    tmp = where / (("fast" if fast else "py") + ("-views" if views else ""))
    tmp.mkdir()
    source: bytes | memoryview = memoryview(bytearray(blob)) if views else blob
    state: tuple[Any, ...]
    ex = Extractor(tmp, 0o027, TarParser(limits), fast=fast)  # not the process's umask
    assert (ex._fast is not None) == fast
    try:
        pos, i = 0, 0
        while pos < len(blob) and not ex.parser.ended:
            n = cuts[i % len(cuts)]
            ex.feed(source[pos:pos + n])
            pos, i = pos + n, i + 1
        if not ex.parser.ended:
            ex.end_of_stream()
        if ex.links:
            recheck_links(ex)
        r = ex.result
        state = (r.entries, r.bytes, r.refused, r.skipped, ex.complete, ex.written,
                 ex.digests.after, sorted(ex.files), sorted(ex.dirs.items()), ex.root_mode)
    except (TarError, IntegrityError, OSError) as exc:
        state = (type(exc).__name__, str(exc))
    finally:
        ex.close()
    # A failed copy's tree is removed: of the file being written then, only what was
    # written counts (its mtime is the clock's until the utime it never got).
    return state, tree(tmp, times=not isinstance(state[0], str))


@settings(max_examples=200, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(runs(), st.sampled_from(["sha256", "sha256-next", "none"]),
       st.lists(often(1 << 20, 1, 7, 512, 700, 1536, 4096), min_size=1, max_size=3),
       often(None, 0).flatmap(lambda c: st.none() if c is None else st.integers(0, 1 << 16)),
       often(TarLimits(), TarLimits(max_meta=100, max_pax_records=1)))
def test_the_compiled_loop_gives_what_the_python_path_gives(
        entries: list[dict[str, Any]], mode: str, cuts: list[int], corrupt: int | None,
        limits: TarLimits) -> None:
    blob = build(entries, mode, corrupt)
    where = Path(tempfile.mkdtemp(prefix="fastpath-"))
    try:
        python = run(blob, cuts, False, where, limits)
        assert run(blob, cuts, True, where, limits) == python
        # Fed views of a receive buffer: the same, on either path.
        assert run(blob, cuts, True, where, limits, views=True) == python
        assert run(blob, cuts, False, where, limits, views=True) == python
    finally:
        shutil.rmtree(where)


def plain(i: int, **kw: Any) -> dict[str, Any]:
    return {"kind": "reg", "name": f"d/f{i}", "mode": 0o755, "mtime": 5 * 10**8 + i,
            "data": bytes([i]) * (100 * i), "digest": "right", "link": "", "extra": None,
            **kw}


ODDITIES = [{"digest": "wrong"}, {"digest": "none"}, {"digest": "bad"},
            {"extra": {"mtime": "1.5.5"}}, {"extra": {"mtime": "17.25"}},
            {"extra": {"uid": "5"}}, {"name": "d/f1"}, {"name": "d/../f"}, {"name": "d/f0/x"},
            {"name": "e/f"}, {"mode": 0o4777}, {"kind": "sym", "link": "../x"}]


@pytest.mark.parametrize("mode", ["sha256", "sha256-next", "none"])
@pytest.mark.parametrize("odd", ODDITIES, ids=str)
def test_one_odd_entry_in_a_run_of_plain_files(tmp_path: Path, mode: str,
                                                odd: dict[str, Any]) -> None:
    """Each oddity, at the start, middle and end of a run the compiled loop takes."""
    for at in (1, 3, 5):
        entries = [plain(i, **(odd if i == at else {})) for i in range(6)]
        blob = build(entries, mode, None)
        where = tmp_path / str(at)
        where.mkdir()
        fast = run(blob, [1 << 20], True, where, TarLimits())
        assert fast == run(blob, [1 << 20], False, where, TarLimits())


def test_a_plain_tree_takes_the_compiled_loop(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """What the benchmarks measure is the compiled loop: of 100 files in one directory
    (the agent's stream, digests trailing), all but the first go through it, whatever
    the cut (a file the piece cuts waits for the next piece)."""
    taken: list[int] = []
    native = fastpath._native
    assert native is not None

    def count(*args: Any) -> Any:
        out = native.run(*args)
        taken.append(out[1])
        return out

    monkeypatch.setattr(fastpath, "_native", type("N", (), {"run": staticmethod(count)}))
    entries = [{"kind": "reg", "name": f"d/f{i}", "mode": 0o644, "mtime": 5 * 10**8 + i,
                "data": os.urandom(4096), "digest": "right", "link": "", "extra": None}
               for i in range(100)]
    blob = build(entries, "sha256-next", None)
    state, files = run(blob, [64 << 10], True, tmp_path, TarLimits())
    assert len(files) == 101 and state[0] == 100
    assert sum(taken) == 99
