"""Tar as a stream, both ways: a PAX (POSIX.1-2001) header writer, and an async
reader that pulls one entry at a time from a byte stream.

Written here rather than with ``tarfile`` so that nothing in a tar is ever
trusted: the reader hands back names and sizes, the caller validates them, and
data is pulled in bounded chunks. All parsing is in :mod:`aggapi.tar.parse`
(a sans-IO parser with bounded metadata; the agent runs it in a worker thread).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping
from typing import Protocol

from aggapi import native
from aggapi.tar.parse import (
    ARCHIVE_END,
    BLK,
    BLOCK,
    CHR,
    CONT,
    DEFAULT_LIMITS,
    DIR,
    FIFO,
    GNU_LONGLINK,
    GNU_LONGNAME,
    GPAX,
    LNK,
    MAX_META,
    PAX,
    REG,
    SPARSE_REFUSED,
    SYM,
    Event,
    TarEntry,
    TarError,
    TarLimits,
    TarParser,
    byte_sum,
)

__all__ = ["ARCHIVE_END", "BLK", "BLOCK", "CHR", "CONT", "DIR", "END", "FIFO", "GNU_LONGLINK",
           "GNU_LONGNAME", "GPAX", "LNK", "MAX_META", "PAX", "REG", "SPARSE_REFUSED", "SYM",
           "ByteStream", "TarEntry", "TarError", "TarLimits", "TarParser", "TarReader",
           "header", "header_size", "pad", "pax_header"]


# --- writer -----------------------------------------------------------------------------

# The compiled builders of the two blocks below (aggapi/tar/_fastheader.c), where built:
# the same bytes (the Python ones are the reference); AGGAPI_PURE_PYTHON=1 leaves them.
_native = None if native.switched_off() else native.optional("aggapi.tar._fastheader")


def _octal(value: int, width: int) -> bytes | None:
    s = b"%0*o" % (width - 1, value)
    return s + b"\0" if len(s) == width - 1 else None


def _records(records: Mapping[str, str]) -> bytes:
    if _native is not None:
        try:
            return bytes(_native.records(records))
        except UnicodeEncodeError:  # the reference raises it, naming its own position
            pass
    return _records_py(records)


def _records_py(records: Mapping[str, str]) -> bytes:
    return b"".join(_pax_record(k, v) for k, v in records.items())


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode("utf-8", "surrogateescape")
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:  # the length counts its own digits
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


_MAX8, _MAX12 = 8 ** 7, 8 ** 11  # what 8- and 12-byte octal fields hold
_MAGIC = b"ustar\x0000"  # magic and version
_TAIL = b"\0" * 64 + b"0000000\0" * 2 + b"\0" * 167  # uname, gname, devmajor/minor, prefix


def _field(value: int, width: int) -> bytes:
    """An octal numeric field; 0 when ``value`` does not fit (the PAX record holds it)."""
    return _octal(value, width) or b"0" * (width - 1) + b"\0"


def _ustar(name: bytes, typeflag: bytes, size: int, mode: int, uid: int, gid: int,
           mtime: int, linkname: bytes = b"") -> bytes:
    if _native is not None:
        hdr: bytes | None = _native.ustar(name, typeflag, size, mode, uid, gid, mtime, linkname)
        if hdr is not None:
            return hdr
    return _ustar_py(name, typeflag, size, mode, uid, gid, mtime, linkname)


def _ustar_py(name: bytes, typeflag: bytes, size: int, mode: int, uid: int, gid: int,
              mtime: int, linkname: bytes = b"") -> bytes:
    # One join of the fixed-width fields (a block per entry: a tree of small files
    # builds thousands), the checksum computed over its spaces, then put in place.
    if 0 <= min(mode, uid, gid, size, mtime) and max(mode, uid, gid) < _MAX8 \
            and max(size, mtime) < _MAX12:
        nums = b"%07o\0%07o\0%07o\0%011o\0%011o\0" % (mode, uid, gid, size, mtime)
    else:
        nums = b"".join((_field(mode, 8), _field(uid, 8), _field(gid, 8), _field(size, 12),
                         _field(mtime, 12)))
    hdr = b"".join((name[:100].ljust(100, b"\0"), nums, b" " * 8,
                    typeflag[:1].ljust(1, b"\0"), linkname[:100].ljust(100, b"\0"), _MAGIC,
                    _TAIL))
    return b"%s%06o\0 %s" % (hdr[:148], byte_sum(hdr), hdr[156:])


def pad(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def _pax_needed(name: str, raw_name: bytes, size: int, uid: int, gid: int, mtime_ns: int,
                linkname: str, raw_link: bytes) -> tuple[dict[str, str], int]:
    """The PAX records an entry needs (ustar cannot hold the field), and its ustar mtime."""
    pax: dict[str, str] = {}
    if len(raw_name) > 100 or not name.isascii():
        pax["path"] = name
    if len(raw_link) > 100 or not linkname.isascii():
        pax["linkpath"] = linkname
    if size >= 8 ** 11:
        pax["size"] = str(size)
    for key, val in (("uid", uid), ("gid", gid)):
        if val >= 8 ** 7:
            pax[key] = str(val)
    sec, ns = divmod(abs(mtime_ns), 1_000_000_000)
    if ns or mtime_ns < 0 or sec >= 8 ** 11:  # (the parser refuses a signed octal field)
        pax["mtime"] = ("-" if mtime_ns < 0 else "") + f"{sec}.{ns:09d}".rstrip("0").rstrip(".")
        sec = sec if 0 <= mtime_ns and sec < 8 ** 11 else 0
    return pax, sec


def header(name: str, typeflag: bytes, *, size: int = 0, mode: int = 0o644, uid: int = 0,
           gid: int = 0, mtime_ns: int = 0, linkname: str = "",
           records: Mapping[str, str] | None = None) -> bytes:
    """Header block(s) for one entry: a PAX ``x`` header first when ustar cannot
    hold a field (long or non-ASCII names, sizes >= 8 GiB, big ids, sub-second mtime),
    or when ``records`` (extra PAX records, e.g. ``AGGAPI.sha256``) are given."""
    raw_name = name.encode("utf-8", "surrogateescape")
    raw_link = linkname.encode("utf-8", "surrogateescape")
    pax, sec = _pax_needed(name, raw_name, size, uid, gid, mtime_ns, linkname, raw_link)
    if records:
        pax.update(records)
    out = b""
    if pax:
        out = pax_header("PaxHeader/" + name[-80:], pax, typeflag=PAX)
    ustar_name = raw_name if len(raw_name) <= 100 else raw_name[-100:]
    out += _ustar(ustar_name, typeflag, size if size < 8 ** 11 else 0, mode & 0o7777,
                  uid if uid < 8 ** 7 else 0, gid if gid < 8 ** 7 else 0, sec,
                  raw_link[:100])
    return out


def header_size(name: str, *, size: int = 0, uid: int = 0, gid: int = 0, mtime_ns: int = 0,
                linkname: str = "", records: Mapping[str, str] | None = None) -> int:
    """``len(header(...))`` for the same fields, without building the blocks (an upload
    sizes its whole tar before sending it; a record's length depends only on the lengths
    of its key and value)."""
    raw_name = name.encode("utf-8", "surrogateescape")
    raw_link = linkname.encode("utf-8", "surrogateescape")
    pax, _ = _pax_needed(name, raw_name, size, uid, gid, mtime_ns, linkname, raw_link)
    if records:
        pax.update(records)
    if not pax:
        return BLOCK
    n = sum(len(_pax_record(k, v)) for k, v in pax.items())
    return 2 * BLOCK + n + (-n % BLOCK)


def pax_header(name: str, records: Mapping[str, str], *, typeflag: bytes = GPAX) -> bytes:
    data = _records(records)
    return _ustar(name.encode("utf-8", "surrogateescape")[:100], typeflag, len(data), 0o644,
                  0, 0, 0) + data + pad(len(data))


END = b"\0" * (2 * BLOCK)


# --- reader -----------------------------------------------------------------------------

class ByteStream(Protocol):
    async def readexactly(self, n: int) -> bytes: ...

    async def read(self, n: int = -1) -> bytes: ...


def _parse(parser: TarParser, data: bytes) -> list[Event]:
    return list(parser.feed(data))


class TarReader:
    """Pull entries from an async byte stream; read or skip each entry's data before the
    next. A thin driver over :class:`TarParser` (which holds all the parsing): it reads
    ``READ_SIZE`` bytes at a time, so its work per call is bounded."""

    READ_SIZE = 64 * 1024

    def __init__(self, stream: ByteStream, limits: TarLimits = DEFAULT_LIMITS) -> None:
        self.stream = stream
        self.parser = TarParser(limits)
        self.events: deque[Event] = deque()
        self.in_data = False  # between an entry and its ENTRY_END
        self.ended = False

    async def _event(self) -> Event:
        while not self.events:
            try:
                data = await self.stream.read(self.READ_SIZE)
            except Exception as exc:  # a broken connection: a truncated tar
                raise TarError("tar stream ended early") from exc
            if not data:
                self.parser.close()  # raises: the stream ended before the archive did
                return ARCHIVE_END
            # Parsing is bounded per read but still CPU: off the event loop, as everywhere
            # (list(): feed is a generator, whose body would otherwise run on the loop).
            self.events.extend(await asyncio.to_thread(_parse, self.parser, data))
        return self.events.popleft()

    async def next(self) -> TarEntry | None:
        while not self.ended:
            ev = await self._event()
            if isinstance(ev, TarEntry):
                self.in_data = True
                return ev
            if ev is ARCHIVE_END:
                self.ended = True
        return None

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the current entry's data; b'' at its end."""
        if not self.in_data:
            return b""
        ev = await self._event()
        if isinstance(ev, bytes):
            if len(ev) > n:
                self.events.appendleft(ev[n:])
                ev = ev[:n]
            return ev
        self.in_data = False  # ENTRY_END (the parser sends nothing else mid-entry)
        return b""

    async def skip(self) -> None:
        while await self.read(1 << 20):
            pass
