"""Tar as a stream, both ways: a PAX (POSIX.1-2001) header writer and a parser
that reads one header at a time from an async byte stream.

Written here rather than with ``tarfile`` so that nothing in a tar is ever
trusted: the parser hands back names and sizes, the caller validates them, and
data is pulled in bounded chunks. The parser understands ustar, PAX ``x``/``g``
extended headers and GNU ``L``/``K`` long names, checks header checksums and
caps the size of every metadata block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

BLOCK = 512
MAX_META = 64 * 1024  # cap on a PAX header or GNU long name block

REG, LNK, SYM, CHR, BLK, DIR, FIFO, CONT = b"0", b"1", b"2", b"3", b"4", b"5", b"6", b"7"
PAX, GPAX, GNU_LONGNAME, GNU_LONGLINK = b"x", b"g", b"L", b"K"


class TarError(ValueError):
    """The stream is not a tar we accept."""


# --- writer -----------------------------------------------------------------------------

def _octal(value: int, width: int) -> bytes | None:
    s = b"%0*o" % (width - 1, value)
    return s + b"\0" if len(s) == width - 1 else None


def _pax_record(key: str, value: str) -> bytes:
    body = f" {key}={value}\n".encode("utf-8", "surrogateescape")
    n = len(body) + 1
    while len(str(n).encode()) + len(body) != n:  # the length counts its own digits
        n = len(str(n).encode()) + len(body)
    return str(n).encode() + body


def _ustar(name: bytes, typeflag: bytes, size: int, mode: int, uid: int, gid: int,
           mtime: int, linkname: bytes = b"") -> bytes:
    hdr = bytearray(BLOCK)

    def put(off: int, width: int, val: bytes) -> None:
        hdr[off:off + len(val[:width])] = val[:width]

    put(0, 100, name)
    for off, width, num in ((100, 8, mode), (108, 8, uid), (116, 8, gid), (124, 12, size),
                            (136, 12, mtime)):
        put(off, width, _octal(num, width) or _octal(0, width) or b"")
    hdr[148:156] = b" " * 8
    put(156, 1, typeflag)
    put(157, 100, linkname)
    put(257, 6, b"ustar\0")
    put(263, 2, b"00")
    put(329, 8, _octal(0, 8) or b"")
    put(337, 8, _octal(0, 8) or b"")
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr)


def pad(size: int) -> bytes:
    return b"\0" * (-size % BLOCK)


def header(name: str, typeflag: bytes, *, size: int = 0, mode: int = 0o644, uid: int = 0,
           gid: int = 0, mtime_ns: int = 0, linkname: str = "") -> bytes:
    """Header block(s) for one entry: a PAX ``x`` header first when ustar cannot
    hold a field (long or non-ASCII names, sizes >= 8 GiB, big ids, sub-second mtime)."""
    raw_name = name.encode("utf-8", "surrogateescape")
    raw_link = linkname.encode("utf-8", "surrogateescape")
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
    sec, ns = divmod(mtime_ns, 1_000_000_000)
    if ns:
        pax["mtime"] = f"{sec}.{ns:09d}".rstrip("0")
    out = b""
    if pax:
        out = pax_header("PaxHeader/" + name[-80:], pax, typeflag=PAX)
    ustar_name = raw_name if len(raw_name) <= 100 else raw_name[-100:]
    out += _ustar(ustar_name, typeflag, size if size < 8 ** 11 else 0, mode & 0o7777,
                  uid if uid < 8 ** 7 else 0, gid if gid < 8 ** 7 else 0, sec,
                  raw_link[:100])
    return out


def pax_header(name: str, records: Mapping[str, str], *, typeflag: bytes = GPAX) -> bytes:
    data = b"".join(_pax_record(k, v) for k, v in records.items())
    return _ustar(name.encode("utf-8", "surrogateescape")[:100], typeflag, len(data), 0o644,
                  0, 0, 0) + data + pad(len(data))


END = b"\0" * (2 * BLOCK)


# --- reader -----------------------------------------------------------------------------

class ByteStream(Protocol):
    async def readexactly(self, n: int) -> bytes: ...

    async def read(self, n: int = -1) -> bytes: ...


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
    pax: dict[str, str] = field(default_factory=dict)


def _num(field_: bytes) -> int:
    if field_ and field_[0] & 0x80:  # GNU base-256
        val = int.from_bytes(field_, "big", signed=False) & ~(0x80 << (8 * (len(field_) - 1)))
        return val
    s = field_.split(b"\0", 1)[0].strip(b" ")
    if not s:
        return 0
    try:
        return int(s, 8)
    except ValueError as exc:
        raise TarError(f"bad numeric field {field_!r}") from exc


def _str(field_: bytes) -> str:
    return field_.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def parse_pax(data: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:pos + 1] == b"\0":
            break
        sp = data.find(b" ", pos)
        if sp < 0:
            raise TarError("bad PAX record")
        try:
            n = int(data[pos:sp])
        except ValueError as exc:
            raise TarError("bad PAX record length") from exc
        rec = data[sp + 1:pos + n]
        if n <= 0 or pos + n > len(data) or not rec.endswith(b"\n") or b"=" not in rec:
            raise TarError("bad PAX record")
        key, _, val = rec[:-1].partition(b"=")
        # Values may hold any byte (a NUL in a path is the caller's to refuse).
        out[key.decode("utf-8", "surrogateescape")] = val.decode("utf-8", "surrogateescape")
        pos += n
    return out


def _pax_time_ns(value: str) -> int:
    sec, _, frac = value.partition(".")
    return int(sec) * 1_000_000_000 + int((frac + "000000000")[:9] or 0) * (-1 if
                                                                         sec.startswith("-")
                                                                         else 1)


class TarReader:
    """Pull entries from a byte stream; read or skip each entry's data before the next."""

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.left = 0  # data bytes of the current entry not yet read
        self.padding = 0
        self.global_pax: dict[str, str] = {}
        self.ended = False

    async def _block(self) -> bytes:
        try:
            return await self.stream.readexactly(BLOCK)
        except Exception as exc:  # IncompleteReadError and friends: a truncated tar
            raise TarError("tar stream ended early") from exc

    async def _meta(self, size: int) -> bytes:
        if size > MAX_META:
            raise TarError(f"tar metadata block of {size} bytes is too large")
        try:
            data = await self.stream.readexactly(size + (-size % BLOCK))
        except Exception as exc:
            raise TarError("tar stream ended early") from exc
        return data[:size]

    async def next(self) -> TarEntry | None:
        if self.left or self.padding:
            await self.skip()
        pax: dict[str, str] = {}
        typeflag = REG
        long_name: str | None = None
        long_link: str | None = None
        while True:
            blk = await self._block()
            if blk == b"\0" * BLOCK:
                self.ended = True
                return None
            stored = _num(blk[148:156])
            if stored != sum(blk[:148]) + 256 + sum(blk[156:]):
                raise TarError("tar header checksum mismatch")
            typeflag = blk[156:157] or REG
            size = _num(blk[124:136])
            if typeflag in (PAX, GPAX):
                recs = parse_pax(await self._meta(size))
                (pax if typeflag == PAX else self.global_pax).update(recs)
                continue
            if typeflag in (GNU_LONGNAME, GNU_LONGLINK):
                val = (await self._meta(size)).split(b"\0", 1)[0]
                text = val.decode("utf-8", "surrogateescape")
                if typeflag == GNU_LONGNAME:
                    long_name = text
                else:
                    long_link = text
                continue
            break
        name = _str(blk[0:100])
        if blk[257:262] == b"ustar" and blk[345:500].strip(b"\0"):
            name = _str(blk[345:500]) + "/" + name
        merged = {**self.global_pax, **pax}
        name = merged.get("path", long_name if long_name is not None else name)
        linkname = merged.get("linkpath", long_link if long_link is not None else
                              _str(blk[157:257]))
        if typeflag == b"\0":
            typeflag = REG
        try:
            if "size" in merged:
                size = int(merged["size"])
            uid = int(merged.get("uid", _num(blk[108:116])))
            gid = int(merged.get("gid", _num(blk[116:124])))
            mtime_ns = (_pax_time_ns(merged["mtime"]) if "mtime" in merged
                        else _num(blk[136:148]) * 1_000_000_000)
        except ValueError as exc:
            raise TarError("bad numeric PAX value") from exc
        if size < 0:
            raise TarError("negative size")
        # Links, directories and devices carry no data whatever the size field says.
        if typeflag in (LNK, SYM, DIR, CHR, BLK, FIFO):
            size = 0
        self.left = size
        self.padding = -size % BLOCK
        return TarEntry(name, typeflag, size, _num(blk[100:108]), uid, gid, mtime_ns,
                        linkname, merged)

    async def read(self, n: int) -> bytes:
        """Up to ``n`` bytes of the current entry's data; b'' at its end."""
        if not self.left:
            if self.padding:
                await self._skip_padding()
            return b""
        want = min(n, self.left)
        try:
            data = await self.stream.read(want)
        except Exception as exc:
            raise TarError("tar stream ended early") from exc
        if not data:
            raise TarError("tar stream ended early")
        self.left -= len(data)
        if not self.left and self.padding:
            await self._skip_padding()
        return data

    async def _skip_padding(self) -> None:
        try:
            await self.stream.readexactly(self.padding)
        except Exception as exc:
            raise TarError("tar stream ended early") from exc
        self.padding = 0

    async def skip(self) -> None:
        while self.left:
            await self.read(1 << 20)
        if self.padding:
            await self._skip_padding()
