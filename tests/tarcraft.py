"""Hand-made tar blocks for the tar parser tests: any field may hold any bytes,
and archives GNU tar made (sparse ones included) from small truncate'd files."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from aggapi.tar.parse import (
    ARCHIVE_END,
    ENTRY_END,
    TarEntry,
    TarLimits,
    TarParser,
)

BLOCK = 512
ZERO2 = b"\0" * 1024

# (offset, width) of the ustar header fields
FIELDS = {"name": (0, 100), "mode": (100, 8), "uid": (108, 8), "gid": (116, 8),
          "size": (124, 12), "mtime": (136, 12), "chksum": (148, 8), "typeflag": (156, 1),
          "linkname": (157, 100), "magic": (257, 6), "version": (263, 2),
          "uname": (265, 32), "gname": (297, 32), "devmajor": (329, 8),
          "devminor": (337, 8), "prefix": (345, 155)}


def octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def block(name: bytes = b"f", typeflag: bytes = b"0", size: int = 0,
          fields: Mapping[str, bytes] | None = None, magic: bytes = b"ustar\x0000",
          checksum: bool = True) -> bytes:
    """One header block; ``fields`` overrides any field with raw bytes (cut to width)."""
    hdr = bytearray(BLOCK)
    vals: dict[str, bytes] = {"name": name, "mode": octal(0o644, 8), "uid": octal(0, 8),
                              "gid": octal(0, 8), "size": octal(size, 12),
                              "mtime": octal(1_700_000_000, 12), "typeflag": typeflag,
                              "devmajor": octal(0, 8), "devminor": octal(0, 8)}
    vals.update(fields or {})
    for key, val in vals.items():
        off, width = FIELDS[key]
        hdr[off:off + width] = val[:width].ljust(width, b"\0")
    hdr[257:265] = magic[:8].ljust(8, b"\0")
    if checksum:
        hdr[148:156] = b" " * 8
        hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr)


def padded(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % BLOCK)


def entry(name: bytes = b"f", data: bytes = b"", typeflag: bytes = b"0",
          fields: Mapping[str, bytes] | None = None) -> bytes:
    return block(name, typeflag, len(data), fields) + padded(data)


def record(key: bytes, value: bytes) -> bytes:
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(b"%d" % n) + len(body) != n:
        n = len(b"%d" % n) + len(body)
    return b"%d" % n + body


def pax(records: Iterable[tuple[bytes, bytes]] | bytes, typeflag: bytes = b"x") -> bytes:
    """A PAX header; ``records`` as pairs, or raw record bytes (for malformed ones)."""
    data = records if isinstance(records, bytes) else b"".join(record(k, v)
                                                              for k, v in records)
    return block(b"PaxHeader", typeflag, len(data)) + padded(data)


def parse(data: bytes, chunk: int | None = None,
          limits: TarLimits | None = None) -> list[tuple[TarEntry, bytes]]:
    """Every entry with its data, feeding ``data`` in pieces of ``chunk`` bytes."""
    p = TarParser(limits or TarLimits())
    out: list[tuple[TarEntry, bytes]] = []
    cur: list[bytes] = []
    step = chunk or max(len(data), 1)
    for i in range(0, len(data), step):
        for ev in p.feed(data[i:i + step]):
            if isinstance(ev, TarEntry):
                out.append((ev, b""))
                cur = []
            elif isinstance(ev, bytes):
                cur.append(ev)
            elif ev is ENTRY_END:
                out[-1] = (out[-1][0], b"".join(cur))
            else:
                assert ev is ARCHIVE_END
    p.close()
    return out


def gnu_tar_available() -> bool:
    return shutil.which("tar") is not None and b"GNU tar" in subprocess.run(
        ["tar", "--version"], capture_output=True, check=False).stdout


SPARSE_FORMATS = {
    "gnu": ["--format=gnu"],
    "pax-0.0": ["--format=pax", "--sparse-version=0.0"],
    "pax-0.1": ["--format=pax", "--sparse-version=0.1"],
    "pax-1.0": ["--format=pax", "--sparse-version=1.0"],
}


def gnu_sparse_tar(tmp: Path, fmt: str, size: int = 3 << 20) -> bytes:
    """A tar GNU tar made with --sparse of a ``size``-byte file holding one 5-byte run."""
    work = tmp / f"sparse-{fmt}"
    work.mkdir()
    img = work / "disk.img"
    subprocess.run(["truncate", "-s", str(size), str(img)], check=True)
    with img.open("r+b") as f:
        f.seek(size // 3)
        f.write(b"hello")
    out = work / "out.tar"
    subprocess.run(["tar", "--sparse", *SPARSE_FORMATS[fmt], "-cf", str(out), "-C", str(work),
                    "disk.img"], check=True)
    return out.read_bytes()


def pax_tar(files: Mapping[str, bytes], links: Mapping[str, str] | None = None) -> bytes:
    """A PAX archive made by tarfile: regular ``files``, then hard ``links`` (name ->
    target), for tests that need a well-formed upload rather than crafted blocks."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.LNKTYPE
            info.linkname = target
            tf.addfile(info)
    return buf.getvalue()


def headers_digest(raw: bytes) -> str:
    """The headers digest of aggapi.tar.entrydigest worked out another way, as the
    tests' oracle: Python's tarfile finds each regular file's data, which is left out
    when its entry carries an AGGAPI.sha256 record; every other byte is hashed."""
    h = hashlib.sha256()
    pos = 0
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        for m in tf:
            if m.isreg() and "AGGAPI.sha256" in m.pax_headers:
                h.update(raw[pos:m.offset_data])
                pos = m.offset_data + m.size
    h.update(raw[pos:])
    return h.hexdigest()
