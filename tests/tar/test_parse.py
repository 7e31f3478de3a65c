"""The tar parser: bounded metadata, strict numeric fields, sparse refusal, and the
same result however the stream is cut into pieces."""

from __future__ import annotations

import asyncio
import io
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.tar import parse as tp
from aggapi.tar import stream as ts
from tests import tarcraft as tc

END = tc.ZERO2


def test_writer_round_trip_any_chunking() -> None:
    raw = (ts.header("a/" + "long" * 40, ts.REG, size=5, mtime_ns=1_500_000_000_5)
           + b"hello" + ts.pad(5) + ts.header("d", ts.DIR, mode=0o755)
           + ts.header("l", ts.SYM, linkname="a/x") + END)
    for chunk in (None, 1, 7, 512, 513):
        got = tc.parse(raw, chunk)
        assert [(e.name, e.typeflag, d) for e, d in got] == [
            ("a/" + "long" * 40, ts.REG, b"hello"), ("d", ts.DIR, b""), ("l", ts.SYM, b"")]
        assert got[0][0].mtime_ns == 1_500_000_000_5
        assert got[2][0].linkname == "a/x"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=3000), max_size=6), st.data())
def test_events_do_not_depend_on_how_the_stream_is_cut(files: list[bytes],
                                                       data: st.DataObject) -> None:
    raw = b"".join(tc.entry(b"f%d" % i, d) for i, d in enumerate(files)) + END
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=20)))
    p = tp.TarParser()
    out: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        for ev in p.feed(raw[a:b]):
            if isinstance(ev, bytes) and out and isinstance(out[-1], bytes):
                out[-1] = out[-1] + ev
            else:
                out.append(ev)
    p.close()
    want: list[object] = []
    for i, d in enumerate(files):
        want += [f"f{i}", *([d] if d else []), tp.ENTRY_END]
    assert [e.name if isinstance(e, tp.TarEntry) else e for e in out] == [*want, tp.ARCHIVE_END]


def test_python_tarfile_archives_parse() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("ü/" + "n" * 150)
        info.size, info.mtime, info.uid = 3, 1_700_000_000.25, 70_000_000
        tf.addfile(info, io.BytesIO(b"abc"))
    [(e, d)] = tc.parse(buf.getvalue())
    assert (e.name, d, e.uid, e.mtime_ns) == ("ü/" + "n" * 150, b"abc", 70_000_000,
                                              1_700_000_000_250_000_000)


# --- bounded metadata (finding 3) -------------------------------------------------------

def test_global_pax_set_is_bounded_in_records() -> None:
    lim = tp.TarLimits()
    raw = b"".join(tc.pax([(b"k%d" % i, b"v")], b"g") + tc.entry(b"./", typeflag=b"5")
                   for i in range(lim.max_global_records + 1)) + END
    with pytest.raises(tp.TarError, match="global PAX"):
        tc.parse(raw)
    # The same key again and again does not grow the set.
    same = b"".join(tc.pax([(b"k", b"v%d" % i)], b"g") + tc.entry(b"./", typeflag=b"5")
                    for i in range(500)) + END
    got = tc.parse(same)
    assert len(got) == 500 and got[-1][0].pax["k"] == "v499"


def test_global_pax_set_is_bounded_in_bytes() -> None:
    lim = tp.TarLimits()
    big = b"v" * 4000
    raw = b"".join(tc.pax([(b"k%d" % i, big)], b"g")
                   for i in range(lim.max_global_bytes // 4000 + 1)) + END
    with pytest.raises(tp.TarError, match="global PAX"):
        tc.parse(raw, limits=tp.TarLimits(max_meta_run=1000))


def test_pax_records_per_entry_are_bounded() -> None:
    n = tp.TarLimits().max_pax_records + 1
    with pytest.raises(tp.TarError, match="PAX records"):
        tc.parse(tc.pax([(b"k%d" % i, b"") for i in range(n)]) + tc.entry() + END)
    half = [(b"k%d" % i, b"") for i in range(n // 2 + 1)]
    two = tc.pax(half) + tc.pax([(k + b"b", v) for k, v in half])  # spread over x headers
    with pytest.raises(tp.TarError, match="PAX records"):
        tc.parse(two + tc.entry() + END)


def test_metadata_headers_in_a_row_are_bounded() -> None:
    run = tp.TarLimits().max_meta_run
    ok = b"".join(tc.pax([(b"comment", b"x")]) for _ in range(run)) + tc.entry() + END
    assert len(tc.parse(ok)) == 1
    bad = b"".join(tc.pax([(b"comment", b"x")]) for _ in range(run + 1)) + tc.entry() + END
    with pytest.raises(tp.TarError, match="in a row"):
        tc.parse(bad)


def test_metadata_block_size_is_bounded() -> None:
    raw = tc.block(b"L", b"L", tp.MAX_META + 1) + b"\0" * 512
    with pytest.raises(tp.TarError, match="too large"):
        tc.parse(raw)


def test_entries_see_global_records_without_copies() -> None:
    raw = tc.pax([(b"comment", b"g1")], b"g") + tc.pax([(b"path", b"px")]) + tc.entry(b"a") \
        + tc.entry(b"b") + END
    (a, _), (b, _) = tc.parse(raw)
    assert (a.name, a.pax["comment"], b.name, b.pax["comment"]) == ("px", "g1", "b", "g1")


# --- numeric fields (finding 6) ---------------------------------------------------------

BAD_FIELDS = {
    "mode base-256 huge": ("mode", b"\x80" + b"\xff" * 7),
    "mode negative": ("mode", b"\xff" * 8),
    "mode not octal": ("mode", b"0000899\0"),
    "uid negative base-256": ("uid", b"\xff\xff\xff\xff\xff\xff\xff\xfe"),
    "uid base-256 over 32 bits": ("uid", b"\x80\x00\x00\x01\x00\x00\x00\x00"),
    "gid garbage": ("gid", b"12x4\0\0\0\0"),
    "size negative base-256": ("size", b"\xff" * 12),
    "size base-256 over off_t": ("size", b"\x80" + b"\xff" * 11),
    "size sign in octal": ("size", b"-0000000001\0"),
    "mtime base-256 huge": ("mtime", b"\x80" + b"\x7f" * 11),
    "mtime base-256 before int64 ns": ("mtime", b"\xff" + b"\0" * 11),
    "devmajor garbage": ("devmajor", b"zz\0\0\0\0\0\0"),
    "devminor base-256 over 32 bits": ("devminor", b"\x80\x01" + b"\0" * 6),
    "base-256 with another high byte": ("size", b"\x81" + b"\0" * 11),
    "checksum garbage": ("chksum", b"9999999\0"),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_out_of_range_header_fields_are_tar_errors(case: str) -> None:
    key, val = BAD_FIELDS[case]
    raw = tc.block(fields={key: val}, checksum=key != "chksum") + END
    with pytest.raises(tp.TarError):
        tc.parse(raw)


BAD_PAX = [
    (b"mtime", v) for v in (b"1e400", b"nan", b"NaN", b"inf", b"-inf", b"+5", b" 5", b"5 ",
                            b"1_0", b"0x10", "\u0663".encode(), b"9" * 30, b"9" * 20,
                            b"1." + b"0" * 40, b"", b"-", b".5", b"1.5.5")
] + [
    (key, v) for key in (b"size", b"uid", b"gid")
    for v in (b"-1", b"1e3", b"nan", b"inf", b"+1", b" 1", b"1_0", b"9" * 21, b"", b"1.0",
              b"\xd9\xa3", str(1 << 64).encode())
] + [(b"uid", b"4294967295"), (b"gid", str(1 << 40).encode()),
     (b"size", str(1 << 63).encode())]


@pytest.mark.parametrize(("key", "value"), BAD_PAX)
def test_bad_pax_numbers_are_tar_errors(key: bytes, value: bytes) -> None:
    with pytest.raises(tp.TarError):
        tc.parse(tc.pax([(key, value)]) + tc.entry() + END)


@pytest.mark.parametrize(("value", "ns"), [
    (b"1700000000", 1_700_000_000 * 10**9), (b"-1.5", -1_500_000_000),
    (b"1.123456789999", 1_123_456_789), (b"0", 0), (b"9223372036", 9_223_372_036 * 10**9)])
def test_good_pax_mtimes(value: bytes, ns: int) -> None:
    [(e, _)] = tc.parse(tc.pax([(b"mtime", value)]) + tc.entry() + END)
    assert e.mtime_ns == ns


@pytest.mark.parametrize("raw", [
    b"0 a=b\n", b"-7 a=b\n", b"+7 a=b\n", b"07a=b\n ", b"1_0 ab=c\n", b"8 a=b\n",
    b"99999999999999999999999 a=b\n", b"7 a=b\nX", b"5 ab\n", b"\xd9\xa3 a=b\n"])
def test_malformed_pax_records_are_tar_errors(raw: bytes) -> None:
    with pytest.raises(tp.TarError):
        tc.parse(tc.pax(raw) + tc.entry() + END)


# --- sparse entries (finding 5) ---------------------------------------------------------

@pytest.mark.skipif(not tc.gnu_tar_available(), reason="needs GNU tar")
@pytest.mark.parametrize("fmt", sorted(tc.SPARSE_FORMATS))
def test_gnu_tar_sparse_archives_are_refused(tmp_path: Path, fmt: str) -> None:
    raw = tc.gnu_sparse_tar(tmp_path, fmt)
    with pytest.raises(tp.TarError, match=f"^{tp.SPARSE_REFUSED}$"):
        tc.parse(raw)


SPARSE_KEYS = [b"GNU.sparse.major", b"GNU.sparse.minor", b"GNU.sparse.map",
               b"GNU.sparse.numblocks", b"GNU.sparse.offset", b"GNU.sparse.numbytes",
               b"GNU.sparse.size", b"GNU.sparse.realsize", b"GNU.sparse.name"]


@pytest.mark.parametrize("typeflag", [b"x", b"g"])
@pytest.mark.parametrize("key", SPARSE_KEYS)
def test_every_gnu_sparse_pax_key_is_refused(key: bytes, typeflag: bytes) -> None:
    with pytest.raises(tp.TarError, match=r"^sparse"):
        tc.parse(tc.pax([(key, b"1")], typeflag) + tc.entry(b"img") + END)


@pytest.mark.parametrize("name", [b"GNUSparseFile.123/img", b"./GNUSparseFile.0/img",
                                  b"d/GNUSparseFile.9/img"])
def test_gnu_sparse_file_names_are_refused(name: bytes) -> None:
    with pytest.raises(tp.TarError, match=r"^sparse"):
        tc.parse(tc.entry(name, b"map") + END)
    with pytest.raises(tp.TarError, match=r"^sparse"):
        tc.parse(tc.pax([(b"path", name)]) + tc.entry(b"img") + END)


def test_gnu_sparse_typeflag_is_refused_as_sparse() -> None:
    gnu_magic = b"ustar  \0"
    raw = tc.block(b"img", b"S", 512, magic=gnu_magic) + b"\0" * 512 + END
    with pytest.raises(tp.TarError, match=r"^sparse"):
        tc.parse(raw)


def test_gnu_header_prefix_area_is_not_part_of_the_name() -> None:
    # Old GNU headers keep atime/ctime where ustar has the name prefix.
    raw = tc.block(b"file", fields={"prefix": b"14723553520\x0014723553520\0"},
                   magic=b"ustar  \0") + END
    [(e, _)] = tc.parse(raw)
    assert e.name == "file"


# --- the async reader -------------------------------------------------------------------

class Chunks:
    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step, self.pos = data, step, 0

    async def read(self, n: int = -1) -> bytes:
        out = self.data[self.pos:self.pos + min(n, self.step)]
        self.pos += len(out)
        return out

    async def readexactly(self, n: int) -> bytes:
        raise AssertionError("not used")


async def test_reader_next_skips_unread_data_and_read_splits() -> None:
    raw = tc.entry(b"a", b"x" * 3000) + tc.entry(b"b", b"yz") + END + b"\0" * 4096
    r = ts.TarReader(Chunks(raw, 700))
    a = await r.next()
    assert a is not None and a.name == "a" and await r.read(10) == b"x" * 10
    b = await r.next()
    assert b is not None and b.name == "b"
    assert [await r.read(1), await r.read(5), await r.read(5)] == [b"y", b"z", b""]
    assert await r.next() is None and await r.next() is None


async def test_reader_truncated_stream_is_tar_error() -> None:
    r = ts.TarReader(Chunks(tc.entry(b"a", b"x" * 3000)[:1500], 100))
    assert (await r.next()) is not None
    with pytest.raises(ts.TarError, match="ended early"):
        await asyncio.wait_for(r.skip(), 5)


def test_base256_fields_in_range_parse() -> None:
    size = 9 << 30
    raw = tc.block(fields={"size": b"\x80" + size.to_bytes(11, "big"),
                           "uid": b"\x80" + (3_000_000_000).to_bytes(7, "big")})
    p = tp.TarParser()
    [e] = [ev for ev in p.feed(raw) if isinstance(ev, tp.TarEntry)]
    assert (e.size, e.uid) == (size, 3_000_000_000)


@pytest.mark.parametrize("mtime_ns", [-1_500_000_000, -5 * 10**9, 0, 8**11 * 10**9,
                                      7 * 10**18 + 1, tp.MIN_TIME_NS + 808, tp.MAX_TIME_NS])
def test_writer_round_trips_any_mtime(mtime_ns: int) -> None:
    [(e, _)] = tc.parse(ts.header("f", ts.REG, mtime_ns=mtime_ns) + END)
    assert e.mtime_ns == mtime_ns


def test_negative_base256_mtime_is_a_time_before_1970() -> None:
    raw = tc.block(fields={"mtime": (-86400).to_bytes(12, "big", signed=True)})
    [e] = [ev for ev in tp.TarParser().feed(raw) if isinstance(ev, tp.TarEntry)]
    assert e.mtime_ns == -86400 * 10**9


def _field_variant(value: int, width: int, form: int) -> bytes:
    """``value`` in a width-byte octal field as writers other than ours fill it."""
    digits = b"%o" % value
    if form == 0:  # zero-padded, NUL-terminated (the common form: the fast path)
        out = digits.rjust(width - 1, b"0") + b"\0"
    elif form == 1:  # space-terminated
        out = digits.rjust(width - 1, b"0") + b" "
    elif form == 2:  # leading spaces, then space and NUL (old tar)
        out = digits.rjust(width - 2, b" ") + b" \0"
    else:  # no padding: digits, then NULs
        out = digits.ljust(width, b"\0")
    assert len(out) == width
    return out


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.integers(0, 0o777777), st.integers(0, 0o777777), st.integers(0, 0o777777),
       st.integers(0, 0o7777777777), st.integers(0, 0o7777777777),
       st.lists(st.integers(0, 3), min_size=6, max_size=6), st.booleans())
def test_standard_fields_read_alike_in_every_form(mode: int, uid: int, gid: int, size: int,
                                                  mtime: int, forms: list[int],
                                                  empty_devs: bool) -> None:
    """The one-match reading of the usual zero-padded fields and the field-by-field one
    agree: a header whose numbers are written in any accepted form (space-terminated,
    space-padded, unpadded; the checksum too) parses to the same entry as the usual
    form, and a wrong checksum is caught on either path."""
    def blk(fs: list[int]) -> bytes:
        raw = bytearray(ts.header("f", ts.REG, size=0, mode=0o644))
        for (off, width, val), form in zip(((100, 8, mode), (108, 8, uid), (116, 8, gid),
                                            (124, 12, size), (136, 12, mtime)), fs,
                                           strict=False):
            raw[off:off + width] = _field_variant(val, width, form)
        if empty_devs:
            raw[329:345] = b"\0" * 16
        raw[148:156] = b" " * 8
        ck = sum(raw)
        raw[148:156] = (b"%06o\0 " % ck if fs[5] == 0 else _field_variant(ck, 8, fs[5]))
        return bytes(raw)

    def first(raw: bytes) -> tp.TarEntry:
        ev = next(iter(tp.TarParser().feed(raw)))
        assert isinstance(ev, tp.TarEntry)
        return ev

    usual, other = first(blk([0] * 6)), first(blk(forms))
    assert usual == other
    assert (usual.mode, usual.uid, usual.gid, usual.size, usual.mtime_ns) == (
        mode, uid, gid, size, mtime * 1_000_000_000)
    bad = bytearray(blk(forms))
    bad[0] ^= 1  # the name changed under an unchanged checksum
    with pytest.raises(tp.TarError, match="checksum"):
        first(bytes(bad))


@settings(max_examples=300, derandomize=True)
@given(st.binary(min_size=512, max_size=512) | st.sampled_from([b"\xff" * 512, b"\0" * 512]))
def test_the_header_checksum_sum_is_exact_for_every_block(blk: bytes) -> None:
    """The Adler-32 shortcut of the checksum's byte sum equals sum() on any 512 bytes
    (all 0xff included: the largest sum a half can have)."""
    assert tp.byte_sum(blk) == sum(blk)


def _time_by_regex(value: str) -> int | None:
    """The PAX mtime grammar as the regex states it (the reference for the fast path)."""
    m = tp._TIME.fullmatch(value)
    if m is None:
        return None
    sign, sec, frac = m.groups()
    ns = int(sec) * tp.NS + int(((frac or "") + "000000000")[:9])
    ns = -ns if sign else ns
    return ns if tp.MIN_TIME_NS <= ns <= tp.MAX_TIME_NS else None


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.one_of(
    st.from_regex(r"-?[0-9]{0,22}(\.[0-9]{0,32})?(\.[0-9]*)?", fullmatch=True),
    st.text(alphabet="0123456789.-\u0661 e+", max_size=30)))
def test_pax_mtime_accepts_exactly_the_grammar(value: str) -> None:
    want = _time_by_regex(value)
    if want is None:
        with pytest.raises(tp.TarError):
            tp._pax_time_ns(value)
    else:
        assert tp._pax_time_ns(value) == want
