"""A push parser for untrusted tar streams: bytes in, entries and data out, no I/O.

Callers feed it the stream in pieces of any size and get back events: a
:class:`TarEntry` when a header is complete, the entry's data as ``bytes``
slices of what was fed, ``ENTRY_END`` after the data and ``ARCHIVE_END`` at
the first zero block. Being sans-IO, it runs where the caller wants it (the
agent runs it in a worker thread, never on the event loop), and its work is
linear in the bytes fed: every header is one block plus at most ``max_meta``
bytes of metadata, the PAX records an entry can see are bounded in count and
bytes (per header and for the accumulated global set), and an entry looks up
the few keys it needs instead of copying the global set.

It understands ustar, PAX ``x``/``g`` extended headers and GNU ``L``/``K``
long names. Everything else is refused with :class:`TarError`: bad
checksums, numeric fields that are malformed, negative or out of range
(octal, base-256 and PAX decimal alike), and sparse entries in every form
(GNU ``S``, PAX ``GNU.sparse.*`` 0.0/0.1/1.0 and ``GNUSparseFile.`` names),
which would otherwise be extracted as their sparse map instead of their data.
"""

from __future__ import annotations

import re
import zlib
from collections import ChainMap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

BLOCK = 512
MAX_META = 64 * 1024  # cap on a PAX header or GNU long name block

REG, LNK, SYM, CHR, BLK, DIR, FIFO, CONT = b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7"
PAX, GPAX, GNU_LONGNAME, GNU_LONGLINK = b"x", b"g", b"L", b"K"
GNU_SPARSE = b"S"
_META = (PAX, GPAX, GNU_LONGNAME, GNU_LONGLINK)
_NO_DATA = (LNK, SYM, DIR, CHR, BLK, FIFO)  # their size field is not data (as tarfile)

SPARSE_REFUSED = "sparse tar entries are not supported"
# aggapi's record of a regular file's sha256 (aggapi.tar.entrydigest): one entry's own,
# so never in a global header, and never given twice (which value would be checked?).
SHA256_RECORD = "AGGAPI.sha256"
# The same for the regular file before an entry, where digests trail their files
# (digest=trailer downloads): on the entry after that file, on the same terms.
PREVIOUS_SHA256_RECORD = "AGGAPI.previousSha256"
ENTRY_RECORDS = frozenset({SHA256_RECORD, PREVIOUS_SHA256_RECORD})
MAX_SIZE = (1 << 63) - 1  # off_t
MAX_ID = (1 << 32) - 2  # uid_t/gid_t; 2**32-1 is (uid_t)-1, "no change"
MAX_MODE = 0o7777777  # what the ustar octal field holds
MAX_DEV = (1 << 32) - 1
NS = 1_000_000_000
MIN_TIME_NS, MAX_TIME_NS = -(1 << 63), (1 << 63) - 1  # what utimensat can be given

# Global records an entry gets as a copy of its own (more: a view, never copied).
COPY_GLOBAL = 4
_ZERO = b"\0" * BLOCK
_HIGH = bytes(b > 127 for b in range(256))  # 1 for each byte that is negative as a char
_SPARSE_NAME = re.compile(r"(?:^|/)GNUSparseFile\.")
_OCTAL = re.compile(rb" *([0-7]*) *")
# mode, uid, gid (7 digits), size and mtime (11 digits), each NUL-terminated, and the
# checksum (6 digits, NUL, space): every such value is within its field's range.
_STD_FIELDS = re.compile(rb"([0-7]{7})\0([0-7]{7})\0([0-7]{7})\0([0-7]{11})\0([0-7]{11})\0"
                         rb"([0-7]{6})\0 ")
_ZERO_DEVS = b"0000000\0" * 2
_DECIMAL = re.compile(r"[0-9]{1,20}")
_TIME = re.compile(r"(-?)([0-9]{1,20})(?:\.([0-9]{0,30}))?")


class TarError(ValueError):
    """The stream is not a tar we accept."""


@dataclass(frozen=True)
class TarLimits:
    max_meta: int = MAX_META  # bytes in one PAX header or GNU long name
    max_pax_records: int = 256  # records in the PAX headers of one entry
    max_global_records: int = 64  # records in the accumulated global (g) set
    max_global_bytes: int = 16 * 1024  # key and value bytes in that set
    max_meta_run: int = 8  # metadata headers (x, g, L, K) in a row before an entry


DEFAULT_LIMITS = TarLimits()


@dataclass
class TarEntry:
    name: str
    typeflag: bytes
    size: int
    mode: int
    uid: int
    gid: int
    mtime_ns: int
    linkname: str
    pax: Mapping[str, str] = field(default_factory=dict)  # this entry's records, then g


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


ENTRY_END = _Marker("ENTRY_END")
ARCHIVE_END = _Marker("ARCHIVE_END")
Event = TarEntry | bytes | memoryview | _Marker  # data: a slice of what was fed


def _num(field_: bytes, what: str, top: int, bottom: int = 0) -> int:
    """An octal or GNU base-256 header field, within [bottom, top]."""
    if field_[:1] == b"\xff":  # base-256, negative: only times may be (before 1970)
        val = int.from_bytes(field_, "big", signed=True)
    elif field_[:1] == b"\x80":
        val = int.from_bytes(field_[1:], "big")
    elif field_ and field_[0] & 0x80:
        raise TarError(f"bad base-256 {what} in a tar header")
    else:
        digits = field_.split(b"\0", 1)[0]
        if digits.isdigit():  # the usual zero-padded field: no regex (a flood of
            try:              # header-only entries is parsed at twice the speed)
                val = int(digits, 8)
            except ValueError:  # an 8 or 9
                raise TarError(f"bad numeric {what} field {field_!r} in a tar header") \
                    from None
        else:
            m = _OCTAL.fullmatch(digits)
            if m is None:
                raise TarError(f"bad numeric {what} field {field_!r} in a tar header")
            val = int(m.group(1), 8) if m.group(1) else 0
    if not bottom <= val <= top:
        raise TarError(f"{what} {val} in a tar header is out of range")
    return val


def _pax_int(value: str, what: str, top: int) -> int:
    if _DECIMAL.fullmatch(value) is None:
        raise TarError(f"bad PAX {what} {value[:40]!r}")
    val = int(value)
    if val > top:
        raise TarError(f"PAX {what} {val} is out of range")
    return val


def _pax_time_ns(value: str) -> int:
    sec, _, frac = value.partition(".")
    # The usual "SECONDS.FRACTION" (aggapi's, GNU tar's) without the regex: the same
    # values as _TIME (bytes.isdigit is ASCII digits only).
    if 0 < len(sec) <= 20 and len(frac) <= 30 and sec.isascii() and frac.isascii() \
            and sec.encode().isdigit() and (not frac or frac.encode().isdigit()):
        ns = int(sec) * NS + int((frac + "000000000")[:9])
        if ns > MAX_TIME_NS:
            raise TarError(f"PAX mtime {value[:40]!r} is out of range")
        return ns
    m = _TIME.fullmatch(value)
    if m is None:
        raise TarError(f"bad PAX mtime {value[:40]!r}")
    sign, sec, frac = m.groups()
    ns = int(sec) * NS + int(((frac or "") + "000000000")[:9])
    ns = -ns if sign else ns
    if not MIN_TIME_NS <= ns <= MAX_TIME_NS:
        raise TarError(f"PAX mtime {value[:40]!r} is out of range")
    return ns


def parse_pax(data: bytes, max_records: int) -> dict[str, str]:
    """The records of one PAX header: ``"%d %s=%s\\n"``, the length counting itself."""
    out: dict[str, str] = {}
    pos, end = 0, len(data)
    while pos < end and data[pos] != 0:
        sp = data.find(b" ", pos, pos + 21)
        digits = data[pos:sp]
        if sp < 0 or not digits.isdigit():  # bytes.isdigit: ASCII digits only
            raise TarError("bad PAX record length")
        n = int(digits)
        rec = data[sp + 1:pos + n]
        if n <= sp - pos + 1 or pos + n > end or not rec.endswith(b"\n") or b"=" not in rec:
            raise TarError("bad PAX record")
        if len(out) >= max_records:
            raise TarError(f"more than {max_records} PAX records for one tar entry")
        key, _, val = rec[:-1].partition(b"=")
        name = key.decode("utf-8", "surrogateescape")
        if name in ENTRY_RECORDS and name in out:
            raise TarError(f"duplicate PAX record {name}")
        # Values may hold any byte (a NUL in a path is the caller's to refuse).
        out[name] = val.decode("utf-8", "surrogateescape")
        pos += n
    return out


def _check_not_sparse(records: Mapping[str, str]) -> None:
    if any(k.startswith("GNU.sparse.") for k in records):
        raise TarError(SPARSE_REFUSED)


def _str(field_: bytes) -> str:
    return field_.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def byte_sum(blk: bytes) -> int:
    """sum(blk) of a 512-byte header, 4x faster: Adler-32's low half is 1 + the byte sum
    mod 65521, and a 256-byte half sums to at most 65280, so it is exact (sum() alone
    was a tenth of a small-file upload's parsing, and of a download's header writing)."""
    mv = memoryview(blk)
    return (zlib.adler32(mv[:256]) & 0xFFFF) + (zlib.adler32(mv[256:]) & 0xFFFF) - 2


class TarParser:
    """Feed bytes with :meth:`feed`, iterate the events; :meth:`close` at the end."""

    def __init__(self, limits: TarLimits = DEFAULT_LIMITS) -> None:
        self.limits = limits
        self.ended = False
        self._buf = bytearray()  # a header or metadata block being gathered
        self._need = BLOCK  # bytes the block being gathered takes (with padding)
        self._meta_type: bytes | None = None  # the metadata header being gathered
        self._meta_size = 0
        self._left = 0  # data bytes of the current entry still to come
        self._pad = 0  # padding after them
        self._global: dict[str, str] = {}  # replaced, never mutated: entries share it
        self._global_bytes = 0
        self._pax: dict[str, str] = {}  # x records for the next entry
        self._long: dict[bytes, str] = {}  # GNU L/K for the next entry
        self._run = 0  # metadata headers since the last entry
        # Where the last data event starts in the piece being fed: a caller that hashes
        # all but file data (aggapi.tar.entrydigest.HeadersHash) cuts the piece there.
        self.data_at = 0
        self.pos = 0  # where the last ENTRY_END's entry ends in its piece (padding left)

    def close(self) -> None:
        if not self.ended:
            raise TarError("tar stream ended early")

    def skip_pad(self, pos: int, end: int) -> int:  # the rest of the last entry's padding
        take = 0 if self._left else self._pad if self._pad <= end - pos else end - pos
        self._pad -= take
        return pos + take

    def at_boundary(self) -> bool:  # a new entry starts next, nothing gathered for it
        busy = self._pad or self._left or self._buf or self._meta_type is not None
        return not (busy or self._pax or self._long or self._run or self.ended)

    def feed(self, data: bytes | memoryview, start: int = 0) -> Iterator[Event]:
        # A caller may stop after an ENTRY_END and go on from self.pos (skip_pad first).
        # The loop of a tree of small files: three headers and a data event per file, so
        # no min() calls and no generator per header (a tenth of the parsing).
        pos, end = start, len(data)
        while pos < end:
            if self.ended:
                return  # after the end-of-archive block the rest is padding
            left = self._left
            if left:
                take = left if left <= end - pos else end - pos
                self.data_at = pos
                yield data[pos:pos + take]
                pos += take
                self._left = left = left - take
                if not left:
                    self.pos = pos
                    yield ENTRY_END
                continue
            if self._pad:
                take = self._pad if self._pad <= end - pos else end - pos
                pos += take
                self._pad -= take
                continue
            need = self._need
            if not self._buf and need <= end - pos:
                block = bytes(data[pos:pos + need])  # all here: no gathering (bytes of a view)
                pos += need
            else:
                take = min(need - len(self._buf), end - pos)
                self._buf += data[pos:pos + take]
                pos += take
                if len(self._buf) < need:
                    return
                block = bytes(self._buf)
                self._buf.clear()
            if self._meta_type is not None:
                self._metadata(block[:self._meta_size])
                continue
            ev = self._header(block)
            if ev is None:
                continue
            yield ev
            if ev is not ARCHIVE_END and not self._left:
                self.pos = pos
                yield ENTRY_END

    def _header(self, blk: bytes) -> Event | None:
        """The event of one header block: an entry (its ENTRY_END is the caller's),
        ARCHIVE_END, or None for a metadata header (its block(s) follow)."""
        if blk == _ZERO:
            self.ended = True
            return ARCHIVE_END
        # The fields as every common writer fills them (zero-padded octal, each value in
        # range by its width): one match instead of six checks (a tree of small files
        # is mostly headers).
        std = _STD_FIELDS.match(blk, 100, 156)
        stored = int(std[6], 8) if std else _num(blk[148:156], "checksum", 1 << 24)
        unsigned = byte_sum(blk) - sum(blk[148:156]) + 256
        if stored != unsigned and stored != unsigned - 256 * sum(blk.translate(_HIGH)):
            raise TarError("tar header checksum mismatch")  # (old writers summed signed)
        typeflag = blk[156:157]
        size = int(std[4], 8) if std else _num(blk[124:136], "size", MAX_SIZE)
        if typeflag == GNU_SPARSE:
            raise TarError(SPARSE_REFUSED)
        if typeflag in _META:
            self._run += 1
            if self._run > self.limits.max_meta_run:
                raise TarError(f"more than {self.limits.max_meta_run} tar metadata headers "
                               "in a row")
            if size > self.limits.max_meta:
                raise TarError(f"tar metadata block of {size} bytes is too large")
            self._meta_type, self._meta_size = typeflag, size
            self._need = size + (-size % BLOCK)
            if not self._need:
                self._metadata(b"")
            return None
        return self._entry(blk, typeflag, size, std)

    def _metadata(self, data: bytes) -> None:
        t, self._meta_type, self._need = self._meta_type, None, BLOCK
        lim = self.limits
        if t in (GNU_LONGNAME, GNU_LONGLINK):
            assert t is not None
            self._long[t] = _str(data)
            return
        recs = parse_pax(data, lim.max_pax_records)
        if b"GNU.sparse." in data:  # (no key can start so otherwise: no walk of them)
            _check_not_sparse(recs)
        if t == PAX:
            for dup in ENTRY_RECORDS.intersection(recs).intersection(self._pax):
                raise TarError(f"duplicate PAX record {dup}")
            self._pax.update(recs)
            if len(self._pax) > lim.max_pax_records:
                raise TarError(f"more than {lim.max_pax_records} PAX records for one tar "
                               "entry")
            return
        if not recs:
            return
        for own in ENTRY_RECORDS.intersection(recs):
            raise TarError(f"PAX record {own} in a global header (it belongs to one entry)")
        merged = {**self._global, **recs}  # at most max_global_records: a bounded copy
        nbytes = self._global_bytes
        for k, v in recs.items():
            old = self._global.get(k)
            nbytes += len(v) - (len(old) if old is not None else -len(k))
        if len(merged) > lim.max_global_records or nbytes > lim.max_global_bytes:
            raise TarError(f"global PAX headers exceed {lim.max_global_records} records or "
                           f"{lim.max_global_bytes} bytes")
        self._global, self._global_bytes = merged, nbytes

    def _entry(self, blk: bytes, typeflag: bytes, size: int,
               std: re.Match[bytes] | None) -> TarEntry:
        g = self._global
        pax: Mapping[str, str]
        if not g:
            pax = self._pax
        elif len(g) <= COPY_GLOBAL:  # a few records (aggapi's one): a plain dict reads
            pax = {**g, **self._pax}  # faster than a ChainMap, for a bounded copy
        else:
            pax = ChainMap(self._pax, g)
        long, self._pax, self._long, self._run = self._long, {}, {}, 0
        magic = blk[257:263]
        raw_name = _str(blk[0:100])
        if magic == b"ustar\0" and blk[345:500].strip(b"\0"):  # GNU keeps times there
            raw_name = _str(blk[345:500]) + "/" + raw_name
        name = pax.get("path", long.get(GNU_LONGNAME, raw_name))
        if ("GNUSparseFile." in name or "GNUSparseFile." in raw_name) and (
                _SPARSE_NAME.search(name) or _SPARSE_NAME.search(raw_name)):
            raise TarError(SPARSE_REFUSED)
        linkname = pax.get("linkpath", long.get(GNU_LONGLINK, _str(blk[157:257])))
        if std:
            mode, uid, gid = int(std[1], 8), int(std[2], 8), int(std[3], 8)
            mtime_ns = int(std[5], 8) * NS
        else:
            mode = _num(blk[100:108], "mode", MAX_MODE)
            uid = _num(blk[108:116], "uid", MAX_ID)
            gid = _num(blk[116:124], "gid", MAX_ID)
            mtime_ns = _num(blk[136:148], "mtime", MAX_TIME_NS // NS,
                            -(MIN_TIME_NS // -NS)) * NS
        if magic in (b"ustar\0", b"ustar ") and blk[329:345] != _ZERO_DEVS:
            _num(blk[329:337], "devmajor", MAX_DEV)
            _num(blk[337:345], "devminor", MAX_DEV)
        if "size" in pax:
            size = _pax_int(pax["size"], "size", MAX_SIZE)
        if "uid" in pax:
            uid = _pax_int(pax["uid"], "uid", MAX_ID)
        if "gid" in pax:
            gid = _pax_int(pax["gid"], "gid", MAX_ID)
        if "mtime" in pax:
            mtime_ns = _pax_time_ns(pax["mtime"])
        if typeflag == b"\0":
            typeflag = REG
        if typeflag in _NO_DATA:
            size = 0
        self._left, self._pad = size, -size % BLOCK
        return TarEntry(name, typeflag, size, mode, uid, gid, mtime_ns, linkname, pax)
