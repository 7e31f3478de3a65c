"""The ncp client's extraction of a tree of many small files, in process (issue 27, item 3).

Builds the tar the agent sends for ``--files`` files of ``--size`` bytes (100 per
directory, each with its ``AGGAPI.sha256`` record and a sub-second mtime, closed by the
completion record), then times :func:`aggapi.client.extract.extract_dir` reading it
from memory in pieces of ``--piece`` bytes (what a TLS connection hands over), as the
client does after the body arrived. Reports wall and CPU time per file; no cluster, no
lock. To compare two checkouts, run it with each on PYTHONPATH:

    PYTHONPATH=/path/to/checkout python3 -m benchmarks.bench_extract_small --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

from aggapi.client.extract import extract_dir
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from aggapi.tar.stream import TarReader


def build_tar(files: int, size: int, per_dir: int = 100) -> bytes:
    out = [ANNOUNCEMENT]
    mtime = 1_700_000_000_123_456_789
    for i in range(files):
        d = f"d{i // per_dir:03d}"
        if i % per_dir == 0:
            out.append(ts.header(d + "/", ts.DIR, mode=0o755, mtime_ns=mtime))
        data = os.urandom(size)
        out.append(ts.header(f"{d}/f{i % per_dir:02d}.dat", ts.REG, size=size, mode=0o644,
                             mtime_ns=mtime, records=record(hashlib.sha256(data).hexdigest())))
        out.append(data + ts.pad(size))
    out.append(ts.pax_header("./PaxHeader", {"AGGAPI.complete": "true"}, typeflag=ts.PAX))
    out.append(ts.header("./", ts.DIR, mode=0o755) + ts.END)
    return b"".join(out)


class MemoryStream:
    """An async byte stream over ``data``, ``piece`` bytes at most per read."""

    def __init__(self, data: bytes, piece: int) -> None:
        self.view = memoryview(data)
        self.piece = piece

    async def read(self, n: int = -1) -> bytes:
        n = self.piece if n < 0 else min(n, self.piece)
        out, self.view = bytes(self.view[:n]), self.view[n:]
        return out

    async def readexactly(self, n: int) -> bytes:
        raise NotImplementedError


async def one(data: bytes, piece: int, where: Path) -> tuple[float, float, float, int]:
    """Wall, user and system CPU seconds (every thread's) of one extraction."""
    dest = where / "out"
    t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    res = await extract_dir(TarReader(MemoryStream(data, piece)), dest)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter() - t0
    shutil.rmtree(dest)
    return wall, r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime, res.entries


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--piece", type=int, default=64 << 10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", type=Path, default=None, help="where to extract (default: a "
                   "temp dir under /tmp)")
    a = p.parse_args()
    data = build_tar(a.files, a.size)
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        for r in range(a.rounds):
            wall, user, system, entries = asyncio.run(one(data, a.piece, Path(d)))
            print(f"round {r + 1}: {entries} entries, {len(data) / 2**20:.1f} MiB tar: "
                  f"wall {wall:.3f} s, CPU user {user:.3f} s + system {system:.3f} s = "
                  f"{user / a.files * 1e6:.0f} + {system / a.files * 1e6:.0f} us/file")


if __name__ == "__main__":
    main()
