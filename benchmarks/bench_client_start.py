"""The ncp client's start-up, from exec to its first request and in all (issue 27, item 3).

A small download is mostly start-up: interpreter, imports, kubeconfig, TLS context.
This runs ``python3 -m aggapi.plugins.ncp -q`` (this checkout's, or ``--root DIR``'s)
``--runs`` times against the in-process fake cluster of tests/client (HTTPS with a
client certificate, as the helm-installed add-on's admin kubeconfig) and prints, as
medians: wall time from the spawn to the first request the server sees, wall time in
all, and the child's user and system CPU seconds (from getrusage: system time is mostly
the file system's, and varies with what else writes to the disk). ``--files N`` downloads a
directory of N files of 4 KiB instead of one tiny file. No cluster, no lock:

    python3 -m benchmarks.bench_client_start [--runs 20] [--files 0] [--root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._sourcetree import source_tree
from tests.client.fakeserver import FakeCluster, Pod

REPO = Path(__file__).resolve().parent.parent


class Stamped(list[dict[str, Any]]):
    """The fake's request log, with the monotonic time of each request's arrival."""

    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def append(self, item: dict[str, Any]) -> None:
        self.times.append(time.monotonic())
        super().append(item)


def _remove(p: Path) -> None:
    if p.is_dir():
        shutil.rmtree(p)
    else:
        p.unlink()


def _children_cpu() -> tuple[float, float]:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime, ru.ru_stime


async def one(fc: FakeCluster, argv: list[str], root: Path, out: Path,
              ) -> tuple[float, float, float, float]:
    """(to the first request, wall, user CPU, system CPU) of one run."""
    log = Stamped()
    fc.requests = log
    env = {**os.environ, "PYTHONPATH": str(root)}
    c0, t0 = _children_cpu(), time.monotonic()
    proc = await asyncio.create_subprocess_exec(*argv, cwd=root, env=env,
                                                stdout=asyncio.subprocess.DEVNULL,
                                                stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    err = await proc.stderr.read()
    code = await proc.wait()
    wall, c1 = time.monotonic() - t0, _children_cpu()  # (one child at a time)
    if code != 0:
        raise SystemExit(f"ncp failed ({code}): {err.decode()[-2000:]}")
    await asyncio.to_thread(_remove, out)
    return log.times[0] - t0, wall, c1[0] - c0[0], c1[1] - c0[1]


async def run(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        rootfs = Path(tmp) / "rootfs"
        (rootfs / "data").mkdir(parents=True)
        (rootfs / "data" / "tiny").write_bytes(b"hello\n")
        if a.files:
            source_tree(rootfs / "data" / "tree", a.files, 4096)
        fc = FakeCluster(Path(tmp) / "srv")
        fc.pods[("default", "web")] = Pod({"app": rootfs})
        await fc.start()
        try:
            kc = fc.kubeconfig()
            src = "web:/data/tree" if a.files else "web:/data/tiny"
            out = Path(tmp) / "out"
            argv = [sys.executable, *a.py_flags.split(), "-m", "aggapi.plugins.ncp", "-q",
                    f"--kubeconfig={kc}", src, str(out)]
            await one(fc, argv, a.root, out)  # warm-up: page cache, .pyc files
            runs = [await one(fc, argv, a.root, out) for _ in range(a.runs)]
        finally:
            await fc.stop()
    first, wall, user, system = (statistics.median(x) for x in zip(*runs, strict=True))
    what = f"{a.files} files of 4 KiB" if a.files else "one 6-byte file"
    print(f"ncp download of {what} from {a.root}, median of {a.runs} runs:")
    print(f"  exec -> first request: {first * 1000:7.1f} ms wall")
    print(f"  in all:                {wall * 1000:7.1f} ms wall, CPU {user * 1000:7.1f} ms user "
          f"+ {system * 1000:6.1f} ms system (min total "
          f"{min(r[2] + r[3] for r in runs) * 1000:.1f})")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--files", type=int, default=0)
    p.add_argument("--root", type=Path, default=REPO, help="the checkout whose client runs")
    p.add_argument("--py-flags", default="", help="interpreter flags, e.g. '-X importtime'")
    asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    main()
