"""Tars for the fake cluster (tests.client.fakeserver): a directory as the agent sends it,
and an upload unpacked as the agent would."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from aggapi.status import StatusError
from aggapi.tar.entrydigest import ANNOUNCEMENT, TRAILING_ANNOUNCEMENT, previous, record
from aggapi.tar.stream import DIR, PAX, REG, SYM, TarReader, header, pad, pax_header


class BytesStream:
    """A received body, read back as a stream."""

    def __init__(self, data: bytes) -> None:
        self.buf = io.BytesIO(data)

    async def readexactly(self, n: int) -> bytes:
        b = self.buf.read(n)
        if len(b) < n:
            raise asyncio.IncompleteReadError(b, n)
        return b

    async def read(self, n: int = -1) -> bytes:
        return self.buf.read(n)


class HashingStream:
    def __init__(self, inner: Any, h: Any) -> None:
        self.inner, self.h, self.size = inner, h, 0

    async def readexactly(self, n: int) -> bytes:
        b: bytes = await self.inner.readexactly(n)
        self.h.update(b)
        self.size += len(b)
        return b

    async def read(self, n: int = -1) -> bytes:
        b: bytes = await self.inner.read(n)
        self.h.update(b)
        self.size += len(b)
        return b


async def untar_into(reader: TarReader, dest: Path) -> int:
    dest.mkdir(exist_ok=True)  # noqa: ASYNC240 (a test fake on local tmp)
    n = 0
    while (e := await reader.next()) is not None:
        parts = [p for p in e.name.split("/") if p not in ("", ".")]
        if e.name.startswith("/") or ".." in parts:
            raise StatusError(400, f"bad tar entry {e.name!r}")
        if not parts:
            continue
        p = dest.joinpath(*parts)
        if e.typeflag == DIR:
            p.mkdir(exist_ok=True)
        elif e.typeflag == SYM:
            os.symlink(e.linkname, p)
        else:
            with open(p, "wb") as f:  # noqa: ASYNC230
                while chunk := await reader.read(1 << 20):
                    f.write(chunk)
            os.chmod(p, e.mode & 0o777)
        n += 1
    return n


def tar_of(d: Path, *, complete: bool = True, trailing: bool = False) -> bytes:
    """A directory as the agent sends it: the announcement of per-file digests, entries
    (each regular file with its AGGAPI.sha256, or with ``trailing`` the entry after it
    with AGGAPI.previousSha256), then the "./" record with AGGAPI.*."""
    out = bytearray(TRAILING_ANNOUNCEMENT if trailing else ANNOUNCEMENT)
    owed: str | None = None

    def hdr(name: str, kind: bytes, **kw: Any) -> bytes:
        nonlocal owed
        recs, owed = {**previous(owed), **kw.pop("records", {})}, None
        return header(name, kind, records=recs, **kw)

    for cur, dirs, files in os.walk(d):
        dirs.sort()
        rel = os.path.relpath(cur, d)
        pre = "" if rel == "." else rel + "/"
        if pre:
            out += hdr(pre, DIR, mode=0o755)
        for name in sorted(files) + sorted(x for x in dirs if os.path.islink(Path(cur, x))):
            p = Path(cur, name)
            if p.is_symlink():
                out += hdr(pre + name, SYM, linkname=os.readlink(p))
            else:
                data = p.read_bytes()
                sha = hashlib.sha256(data).hexdigest()
                out += hdr(pre + name, REG, size=len(data), mode=p.stat().st_mode,
                           records={} if trailing else record(sha))
                out += data + pad(len(data))
                owed = sha if trailing else None
    if complete:
        out += pax_header("./", {"AGGAPI.complete": "true", "AGGAPI.skipped": "[]",
                                 **previous(owed)}, typeflag=PAX)
        out += header("./", DIR, mode=0o755)
    out += b"\0" * 1024
    return bytes(out)
