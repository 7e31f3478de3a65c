"""Fuzzing the tar parser (issue 13, findings 3 and 6): generated headers and mutated
real archives may only ever fail with TarError (a 400 on the agent), with memory
bounded by a constant and work bounded per byte.

Work is counted, not timed: every Python and C function call the parser makes is
counted with a profile hook, and must stay under a constant plus a few per byte. The
one CPU-time check compares two inputs side by side in the same run (hostile vs
benign, small vs large), so the machine's speed cancels out.

Run with ``-s`` to see how many cases each fuzzer ran.
"""

from __future__ import annotations

import io
import sys
import tarfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.tar import parse as tp
from aggapi.tar import stream as ts
from tests import tarcraft as tc

RUNS: Counter[str] = Counter()
FUZZ = settings(max_examples=250, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\ntar fuzz cases run: {dict(sorted(RUNS.items()))}")


def consume(raw: bytes, chunk: int) -> None:
    """Parse ``raw`` fed ``chunk`` bytes at a time, checking the events' shape."""
    p = tp.TarParser()
    want = got = 0
    in_entry = False
    for i in range(0, len(raw), chunk):
        for ev in p.feed(raw[i:i + chunk]):
            if isinstance(ev, tp.TarEntry):
                assert not in_entry
                in_entry, want, got = True, ev.size, 0
                assert isinstance(ev.name, str) and 0 <= ev.size <= tp.MAX_SIZE
                assert tp.MIN_TIME_NS <= ev.mtime_ns <= tp.MAX_TIME_NS
                assert 0 <= ev.uid <= tp.MAX_ID and 0 <= ev.gid <= tp.MAX_ID
            elif isinstance(ev, bytes):
                assert in_entry
                got += len(ev)
                assert got <= want
            elif ev is tp.ENTRY_END:
                assert in_entry and got == want
                in_entry = False
    p.close()


class Calls:
    """Counts function calls (Python and C) while active."""

    def __init__(self) -> None:
        self.n = 0

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            self.n += 1

    def __enter__(self) -> Calls:
        sys.setprofile(self.hook)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(None)


CHUNK = 4096
MEM_BOUND = 3 * tp.MAX_META + 4 * CHUNK + (64 << 10)  # a metadata block or two, a chunk
CALLS_FIXED, CALLS_PER_BYTE, CALLS_PER_FEED = 400, 2, 10


def check_bounded(raw: bytes, chunk: int, kind: str) -> None:
    """Only TarError; peak memory a constant; calls a constant plus a few per byte."""
    RUNS[kind] += 1
    tracemalloc.start()
    try:
        consume(raw, chunk)
    except tp.TarError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak <= MEM_BOUND + chunk, (peak, len(raw))
    with Calls() as calls:
        try:
            consume(raw, chunk)
        except tp.TarError:
            pass
    # consume's own calls per event and per piece fed are included: generous, but linear.
    feeds = -(-len(raw) // chunk)
    bound = CALLS_FIXED + CALLS_PER_BYTE * len(raw) + CALLS_PER_FEED * feeds
    assert calls.n <= bound, (calls.n, len(raw), chunk)


# --- structured: headers with generated fields ------------------------------------------

NUM_WIDTH = {"mode": 8, "uid": 8, "gid": 8, "size": 12, "mtime": 12, "devmajor": 8,
             "devminor": 8, "chksum": 8}


def numeric(width: int) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.integers(0, 8 ** (width - 1) - 1).map(lambda v: tc.octal(v, width)),
        st.binary(min_size=width - 1, max_size=width - 1).map(lambda b: b"\x80" + b),
        st.binary(min_size=width - 1, max_size=width - 1).map(lambda b: b"\xff" + b),
        st.binary(max_size=width),
        st.sampled_from([b" " * width, b"0" * width, b"7" * width, b"-1\0", b"8\0"]))


NAMES = st.one_of(st.binary(max_size=110), st.sampled_from([
    b"./", b".", b"a/../b", b"/etc/passwd", b"GNUSparseFile.1/x", b"a\0b", b"d/", b""]))
PAX_KEYS = st.one_of(st.sampled_from([
    b"path", b"linkpath", b"size", b"uid", b"gid", b"mtime", b"atime", b"comment",
    b"hdrcharset", b"SCHILY.xattr.user.a", *[k.encode() for k in (
        "GNU.sparse.major", "GNU.sparse.minor", "GNU.sparse.map", "GNU.sparse.numblocks",
        "GNU.sparse.offset", "GNU.sparse.numbytes", "GNU.sparse.size",
        "GNU.sparse.realsize", "GNU.sparse.name")]]), st.binary(min_size=1, max_size=12))
PAX_VALUES = st.one_of(st.binary(max_size=40), st.sampled_from([
    b"0", b"-1", b"1e400", b"nan", b"inf", b"9" * 40, b"1.5", b"-1.5", b"18446744073709551616",
    b"4294967295", b"GNUSparseFile.0/x", b"1" + b"0" * 25]))
TYPEFLAGS = st.one_of(st.sampled_from([b"0", b"\0", b"1", b"2", b"3", b"4", b"5", b"6", b"7",
                                       b"x", b"g", b"L", b"K", b"S", b"V", b"D", b"M"]),
                      st.binary(min_size=1, max_size=1))


@st.composite
def member(draw: st.DrawFn) -> bytes:
    t = draw(TYPEFLAGS)
    fields = draw(st.dictionaries(st.sampled_from(sorted(NUM_WIDTH)), st.just(b""),
                                  max_size=3))
    raw_fields = {k: draw(numeric(NUM_WIDTH[k])) for k in fields}
    if t in (b"x", b"g"):
        recs = draw(st.lists(st.tuples(PAX_KEYS, PAX_VALUES), max_size=6))
        data = b"".join(tc.record(k.replace(b"=", b"_"), v) for k, v in recs)
        if draw(st.booleans()):
            data = draw(st.binary(max_size=60)) + data  # a broken record first
    elif t in (b"L", b"K"):
        data = draw(NAMES)
    else:
        data = b"d" * draw(st.integers(0, 1500))
    size = len(data) if "size" not in raw_fields else 0
    blk = tc.block(draw(NAMES), t, size, raw_fields,
                   magic=draw(st.sampled_from([b"ustar\x0000", b"ustar  \0", b"\0" * 8])),
                   checksum="chksum" not in raw_fields)
    return blk + tc.padded(data)


@FUZZ
@given(st.lists(member(), max_size=12), st.sampled_from([b"", tc.ZERO2, b"\0" * 512]),
       st.sampled_from([1, 100, 512, 4096]))
def test_fuzz_generated_headers(members: list[bytes], end: bytes, chunk: int) -> None:
    check_bounded(b"".join(members) + end, chunk, "structured")


@FUZZ
@given(st.lists(st.tuples(PAX_KEYS, PAX_VALUES), min_size=1, max_size=4),
       st.sampled_from([b"x", b"g"]), st.sampled_from(["mtime", "size", "uid", "gid", "mode",
                                                        "devmajor", "devminor"]),
       st.data())
def test_fuzz_numeric_fields(recs: list[tuple[bytes, bytes]], t: bytes, field: str,
                             data: st.DataObject) -> None:
    """Every numeric field, in the header and in PAX records: a value or a TarError."""
    raw = tc.pax([(k.replace(b"=", b"_"), v) for k, v in recs], t) + tc.block(
        fields={field: data.draw(numeric(NUM_WIDTH[field]))}) + tc.ZERO2
    check_bounded(raw, 512, "numeric")


# --- unstructured: byte mutations of real archives --------------------------------------

def seeds(tmp: Path) -> list[bytes]:
    out = [ts.header("a/" + "n" * 120, ts.REG, size=3, mtime_ns=5_000_000_001) + b"abc"
           + ts.pad(3) + ts.header("d", ts.DIR) + ts.header("l", ts.SYM, linkname="a")
           + ts.pax_header("g", {"comment": "x"}) + ts.END]
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
            info = tarfile.TarInfo("dir/" + "long" * (20 if fmt == tarfile.USTAR_FORMAT else 30))
            info.size, info.uid = 700, 3_000_000 if fmt != tarfile.USTAR_FORMAT else 7
            tf.addfile(info, io.BytesIO(b"z" * 700))
            link = tarfile.TarInfo("ln")
            link.type = tarfile.SYMTYPE
            link.linkname = "x" if fmt == tarfile.USTAR_FORMAT else "x" * 150
            tf.addfile(link)
        out.append(buf.getvalue())
    if tc.gnu_tar_available():
        out += [tc.gnu_sparse_tar(tmp, f) for f in sorted(tc.SPARSE_FORMATS)]
    return out


@pytest.fixture(scope="module")
def seed_archives(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    return seeds(tmp_path_factory.mktemp("seeds"))


@st.composite
def mutated(draw: st.DrawFn, base: bytes) -> bytes:
    buf = bytearray(base)
    for _ in range(draw(st.integers(1, 8))):
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut", "dup"]))
        if op == "flip" and buf:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and buf:
            buf[pos] = draw(st.sampled_from([0, 0x20, 0x30, 0x37, 0x38, 0x80, 0xff, 0x0a]))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=600))
        elif op == "delete":
            del buf[pos:pos + draw(st.integers(1, 600))]
        elif op == "cut":
            del buf[pos:]
        elif op == "dup":
            start = pos - pos % 512
            buf[start:start] = buf[start:start + 512 * draw(st.integers(1, 3))]
    return bytes(buf)


@FUZZ
@given(st.data(), st.sampled_from([1, 333, 512, 4096]))
def test_fuzz_mutated_archives(seed_archives: list[bytes], data: st.DataObject,
                               chunk: int) -> None:
    base = data.draw(st.sampled_from(seed_archives))
    check_bounded(data.draw(mutated(base)), chunk, "mutation")


# --- work per byte, side by side --------------------------------------------------------

def hostile(n_pairs: int) -> bytes:
    """The finding's shape: global headers (each a new key, up to the limit, then the
    same keys again) between "./" entries, with a full PAX header per entry."""
    lim = tp.TarLimits()
    x = tc.pax([(b"k%d" % i, b"v") for i in range(lim.max_pax_records)])
    return b"".join(tc.pax([(b"g%d" % (i % lim.max_global_records), b"v" * 60)], b"g") + x
                    + tc.entry(b"./", typeflag=b"5") for i in range(n_pairs)) + tc.ZERO2


def benign(nbytes: int) -> bytes:
    """Small files of one header and one data block each, about ``nbytes`` long."""
    return b"".join(tc.entry(b"f%d" % i, b"d" * 500) for i in range(nbytes // 1024)) \
        + tc.ZERO2


def cpu_per_byte(raw: bytes) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        consume(raw, 1 << 20)
        best = min(best, time.process_time() - t)
    return best / len(raw)


def test_parse_work_is_linear_and_hostile_input_costs_like_benign() -> None:
    small, large = hostile(50), hostile(400)
    with Calls() as a:
        consume(small, 1 << 20)
    with Calls() as b:
        consume(large, 1 << 20)
    # Eight times the input, eight times the calls (give or take a fixed part).
    assert b.n / a.n < 8 * 1.1, (a.n, b.n)
    ratio = cpu_per_byte(large) / cpu_per_byte(small)
    assert ratio < 3, ratio  # quadratic growth would be about 8
    versus = cpu_per_byte(large) / cpu_per_byte(benign(len(large)))
    print(f"\nhostile tar: calls x{b.n / a.n:.2f} for x8 bytes, CPU per byte x{ratio:.2f}; "
          f"{versus:.1f} times the CPU per byte of small benign files")
    assert versus < 20, versus  # PAX records cost more per byte than headers, but linearly
