"""Tar parse cost per MiB (issue 13, finding 3): hostile tars against a plain one.

Inputs, all about ``--mib`` MiB (13.6 by default, the size of the finding's upload):

* ``finding``: a MiB of global PAX headers full of new keys, then "./" entries (the
  shape that made the agent spend 51 s of CPU: the global set only grew, and was
  copied into every entry);
* ``hostile``: the worst the limits allow: global headers at the record limit, a full
  PAX header of records and a "./" entry, again and again;
* ``finding/8``, ``hostile/8``: the same at an eighth of the size (parse cost must be
  linear: the same per MiB);
* ``plain``: one large file.

Measures the agent's parse path: the sans-IO ``aggapi.tar.parse.TarParser`` fed 1 MiB
at a time, or, on code from before it existed (a8bd110), the async ``TarReader`` the
agent then ran on its event loop. To measure the old code:

    PYTHONPATH=/path/to/old/checkout python3 benchmarks/bench_tarparse.py
    python3 -m benchmarks.bench_tarparse [--mib 13.6]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import time

import aggapi

# The parser's modules by where a checkout has them: aggapi/tar/ now, the package root
# before (the TarReader baseline a8bd110 has no parser at all).
_ROOT = importlib.util.find_spec("aggapi.tar") is None
ts = importlib.import_module("aggapi.tarstream" if _ROOT else "aggapi.tar.stream")

MiB = 1 << 20


def finding(nbytes: int) -> bytes:
    """Global headers of many new keys (one byte in fourteen), then "./" entries for
    the rest: each entry used to copy the whole global set, so cost grew as bytes²."""
    global_bytes = nbytes // 14
    out: list[bytes] = []
    key = 0
    while sum(map(len, out)) < global_bytes:
        recs = {f"k{key + i:07d}": "" for i in range(60 * 1024 // 14)}
        key += len(recs)
        out.append(ts.pax_header("g", recs) + ts.header("./", ts.DIR))
    head = b"".join(out)
    dot = ts.header("./", ts.DIR)
    return head + dot * ((nbytes - len(head)) // len(dot)) + ts.END


def hostile(nbytes: int) -> bytes:
    x = ts.pax_header("x", {f"k{i}": "" for i in range(256)}, typeflag=ts.PAX)
    one = ts.pax_header("g", {"g0": "v" * 60}) + x + ts.header("./", ts.DIR)
    return b"".join(ts.pax_header("g", {f"g{i % 64}": "v" * 60}) + x + ts.header("./", ts.DIR)
                    for i in range(nbytes // len(one))) + ts.END


def plain(nbytes: int) -> bytes:
    return ts.header("big", ts.REG, size=nbytes) + b"\x5a" * nbytes + ts.pad(nbytes) + ts.END


def parse_new(raw: bytes) -> tuple[int, str]:
    tp = importlib.import_module("aggapi.tarparse" if _ROOT else "aggapi.tar.parse")
    TarError, p = tp.TarError, tp.TarParser()
    fed = 0
    try:
        for i in range(0, len(raw), MiB):
            fed += len(raw[i:i + MiB])
            for _ in p.feed(raw[i:i + MiB]):
                pass
        p.close()
    except TarError as exc:
        return fed, f"refused: {exc}"
    return fed, "accepted"


class _Mem:
    def __init__(self, data: bytes) -> None:
        self.view, self.pos = memoryview(data), 0

    async def readexactly(self, n: int) -> bytes:
        if self.pos + n > len(self.view):
            raise asyncio.IncompleteReadError(b"", n)
        out = bytes(self.view[self.pos:self.pos + n])
        self.pos += n
        return out

    async def read(self, n: int = -1) -> bytes:
        out = bytes(self.view[self.pos:self.pos + n])
        self.pos += len(out)
        return out


def parse_old(raw: bytes) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        stream = _Mem(raw)
        reader = ts.TarReader(stream)
        try:
            while await reader.next() is not None:
                while await reader.read(MiB):
                    pass
        except ts.TarError as exc:
            return stream.pos, f"refused: {exc}"
        return stream.pos, "accepted"
    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=float, default=13.6)
    args = ap.parse_args()
    nbytes = int(args.mib * MiB)
    new = importlib.util.find_spec("aggapi.tarparse" if _ROOT else "aggapi.tar.parse") is not None
    parse = parse_new if new else parse_old
    print(f"aggapi from {aggapi.__file__}: "
          f"{'TarParser (worker thread)' if new else 'TarReader (event loop, a8bd110)'}")
    per_mib: dict[str, float] = {}
    for label, make, size in (("finding", finding, nbytes), ("finding/8", finding, nbytes // 8),
                              ("hostile", hostile, nbytes), ("hostile/8", hostile, nbytes // 8),
                              ("plain", plain, nbytes)):
        raw = make(size)
        t = time.process_time()
        fed, result = parse(raw)
        cpu = time.process_time() - t
        per_mib[label] = cpu / (fed / MiB)
        print(f"{label:10} {len(raw) / MiB:6.1f} MiB  parsed {fed / MiB:6.1f} MiB  "
              f"CPU {cpu:8.3f} s  {per_mib[label]:8.4f} CPU-s/MiB  {result[:60]}")
    for name in ("finding", "hostile"):
        growth = per_mib[name] / per_mib[name + "/8"]
        print(f"{name} per-MiB cost at 8x the size: x{growth:.2f} "
              f"({'linear' if growth < 1.5 else 'NOT linear'}, bound 1.5)")
    print(f"hostile vs plain per MiB: x{per_mib['hostile'] / per_mib['plain']:.0f}; "
          f"finding vs plain: x{per_mib['finding'] / per_mib['plain']:.0f}")


if __name__ == "__main__":
    main()
