"""A directory upload's hashing, the whole tar's sha256 against its headers digest
(issue 27: each file's data hashed once), in process, side by side in one run.

Each regular file's data is hashed for its own AGGAPI.sha256 record on both sides. With
the whole tar's sha256 (``sha256=trailer`` or hex) it is hashed once more; with the
headers digest (``sha256=headers-trailer`` or ``headers:<hex>``,
:mod:`aggapi.tar.entrydigest`) it is not. Measured per side, in CPU-s per GiB of file
data, the same tree through:

* the client: ``packtar.tar_stream`` building and hashing the tar (files read from the
  page cache, each file's record digest, the tar's digest), as ``upload_dir`` runs it;
* the agent: the body through the sans-IO parser, each file's data hashed as
  ``AtomicFile`` does and the tar's digest as ``untar.TarSink`` does (no file writes:
  those cost the same either way).

A sha256 pass over the same bytes alone is the yardstick: the goal is that the headers
digest saves at least 80% of one such pass on each side.

    python3 -m benchmarks.bench_tar_digest [--files 40] [--file-mib 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import resource
import shutil
import tempfile
from pathlib import Path

from aggapi.client import packtar
from aggapi.tar.entrydigest import HeadersHash
from aggapi.tar.parse import TarEntry, TarParser

MiB = 1 << 20


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)  # every thread: tar_stream's workers too
    return r.ru_utime + r.ru_stime


async def client_pass(src: Path, headers_only: bool) -> tuple[list[bytes], str]:
    h = hashlib.sha256()
    listing = packtar.list_tree(src)
    chunks = [c async for c in packtar.tar_stream(src, listing, hasher=h,
                                                  headers_only=headers_only)]
    return chunks, h.hexdigest()


def agent_pass(chunks: list[bytes], headers_only: bool) -> str:
    parser = TarParser()
    whole = hashlib.sha256()
    headers = HeadersHash()
    file_hash = hashlib.sha256()
    for data in chunks:
        if headers_only:
            headers.piece(data)
        else:
            whole.update(data)
        for ev in parser.feed(data):
            if isinstance(ev, TarEntry):
                file_hash = hashlib.sha256()
            elif isinstance(ev, bytes):
                file_hash.update(ev)
                if headers_only:
                    headers.skip(parser.data_at, len(ev))
        if headers_only:
            headers.done()
    return headers.hexdigest() if headers_only else whole.hexdigest()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=40)
    p.add_argument("--file-mib", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="bench-tar-digest-"))
    try:
        src = tmp / "src"
        src.mkdir()
        for i in range(a.files):
            (src / f"f{i:04d}").write_bytes(os.urandom(a.file_mib * MiB))
        gib = a.files * a.file_mib * MiB / (1 << 30)
        best: dict[tuple[str, str], float] = {}
        sha_alone = float("inf")
        for _ in range(a.rounds):
            for mode in ("whole", "headers"):
                t = cpu()
                chunks, claim = asyncio.run(client_pass(src, mode == "headers"))
                c = cpu() - t
                t = cpu()
                got = agent_pass(chunks, mode == "headers")
                ag = cpu() - t
                assert got == claim, (mode, got, claim)
                for side, used in (("client", c), ("agent", ag)):
                    best[side, mode] = min(best.get((side, mode), float("inf")), used / gib)
            t = cpu()
            h = hashlib.sha256()
            for chunk in chunks:
                h.update(chunk)
            sha_alone = min(sha_alone, (cpu() - t) / gib)
        print(f"{a.files} x {a.file_mib} MiB, best of {a.rounds}; sha256 alone "
              f"{sha_alone:.2f} CPU-s/GiB")
        for side in ("client", "agent"):
            whole, hdr = best[side, "whole"], best[side, "headers"]
            ok = whole - hdr >= 0.8 * sha_alone
            print(f"  {side:6s}  whole tar {whole:5.2f}  headers digest {hdr:5.2f} CPU-s/GiB"
                  f"  (saves {whole - hdr:.2f}; goal >= {0.8 * sha_alone:.2f}: "
                  f"{'met' if ok else 'NOT met'})")
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
