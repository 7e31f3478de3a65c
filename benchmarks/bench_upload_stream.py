"""A tree of small files uploaded streamed against built first (issue 27 item 3), in
process, side by side in one run: what the AGENT costs for the same tar.

The same tar of ``--files`` x ``--file-kib`` KiB files is POSTed (format=tar) to the real
agent app (its own process, mTLS, as bench_copy starts it), straight and through the
aggapi apiserver's relay, three ways:

* ``whole``     the tar built before the request (as ``upload_dir`` did up to
                READ_ONCE_MAX before it streamed), its headers digest up front
                (``sha256=headers:<hex>``);
* ``trailer``   the same built tar, the digest after it (``sha256=headers-trailer``):
                the trailer path alone;
* ``streamed``  the tar built while it is sent (``packtar.tar_stream`` in a worker, as
                ``upload_dir`` streams), the digest after it.

Every upload goes to a target of its own, all removed at the end: this VM's root is an
ext4 without a journal, where a new inode skips every inode freed in the last 30 s
(ext4's ``recently_deleted``, which reads each one's inode block), so removing one
upload's 10,000 files before the next made that one pay 2-4x the agent's CPU, most of
it in ``openat``; the bench waits 35 s before its first upload for the same reason.

Printed per way: the agent's (and the relay's) CPU-s per GiB of tar, the client's, and
the wall time, each the median of ``--rounds`` interleaved rounds (medians per column:
the shared CPUs swing single rounds by +-30%). Goal: the agent's CPU streamed
at most 1.1x whole.

    python3 -m benchmarks.bench_upload_stream [--files 10000] [--file-kib 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp

from aggapi import eventloop, wire
from aggapi.auth.capability import ContainerRef
from aggapi.client import packtar
from aggapi.client.connection import Connection
from aggapi.client.copy import RemotePath, build_first, pack_dir, upload_dir
from benchmarks._copyclient import ncp_kubeconfig
from benchmarks._copyrig import GV, NODE, USER, apiserver_process, endpoint_slice, fake_pod
from benchmarks._copyservers import child
from benchmarks._procstats import cpu_seconds
from benchmarks._sourcetree import source_tree

GOAL = 1.1
SETTLE_S = 35.0
WAYS = ("whole", "trailer", "paced", "trickled", "streamed")
# ``paced``: the built tar, its digest up front, a pause after each MiB as long as
# building that MiB takes the client: the streamed arrival without the client's work
# running beside the agent's.
PACE = 0.05
# ``trickled``: the built tar in 32 KiB pieces, a pause after each, so each arrives on
# its own (as a proxy forwards a body that comes slower than it can send it on).
TRICKLE, TRICKLE_PAUSE = 32 << 10, 0.001


async def built(src: Path, listing: packtar.Listing) -> tuple[list[bytes], str]:
    """The tar as upload_dir keeps it, and its headers digest."""
    h = hashlib.sha256()
    kept = [c async for c in packtar.tar_stream(src, listing, hasher=h, headers_only=True)]
    return kept, h.hexdigest()


def body_of(way: str, src: Path, listing: packtar.Listing, kept: list[bytes]
            ) -> tuple[Callable[[], AsyncIterator[bytes]], str | None]:
    """The body generator and the digest claim (None: a trailer the body ends with)."""
    if way == "streamed":
        async def stream() -> AsyncIterator[bytes]:
            h = hashlib.sha256()
            async for c in packtar.tar_stream(src, listing, hasher=h, headers_only=True):
                yield c
            yield h.digest()
        return stream, None

    async def replay() -> AsyncIterator[bytes]:
        for c in kept:
            if way == "trickled":
                for i in range(0, len(c), TRICKLE):
                    yield c[i:i + TRICKLE]
                    await asyncio.sleep(TRICKLE_PAUSE)
                continue
            yield c
            if way == "paced":
                await asyncio.sleep(PACE)
        if way == "trailer":
            h = hashlib.sha256()
            # Not timed apart: the headers digest of the kept tar, as a client would
            # have computed it while building it.
            async for _ in packtar.tar_stream(src, listing, hasher=h, headers_only=True):
                pass
            yield h.digest()
    return replay, None if way == "trailer" else way


async def _attach(pid: int, name: str) -> asyncio.subprocess.Process | None:
    """Under ``BENCH_ATTACH='strace -c -f -o DIR/{name}.txt -p {pid}'`` (or ``perf stat
    ... -p {pid}``, any command that stops on SIGINT): run attached to the agent during
    one upload, {name} being <leg>-<way>-<n>. Counts of syscalls or context switches are
    not blurred by the shared CPUs as CPU seconds are."""
    template = os.environ.get("BENCH_ATTACH")
    if not template:
        return None
    argv = template.format(pid=pid, name=name).split()
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    await asyncio.sleep(1)  # attached before the first byte
    return proc


async def run(files: int, kib: int, rounds: int, work: Path, ways: list[str],
              legs_wanted: list[str]) -> dict[str, dict[str, float]]:
    src = work / "src"
    source_tree(src, files, kib << 10)
    listing = packtar.list_tree(src)
    size = packtar.tar_size(src, listing)
    kept, headers_hex = await built(src, listing)
    p, root, pod_uid, kube, signer = await fake_pod(work)
    runs: dict[str, list[dict[str, float]]] = {}
    sessions: list[aiohttp.ClientSession] = []
    n = 0

    def session(url: str, ctx: ssl.SSLContext) -> aiohttp.ClientSession:
        s = aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(ssl=ctx),
                                  timeout=aiohttp.ClientTimeout(total=None))
        sessions.append(s)
        return s

    try:
        async with AsyncExitStack() as stack:
            aurl, apid = await stack.enter_async_context(
                child("agent", str(p.dir), str(root), str(work / "state"), pod_uid))
            kube.put("apis/discovery.k8s.io/v1", "endpointslices",
                     endpoint_slice(int(aurl.rsplit(":", 1)[1])))
            url, api = await stack.enter_async_context(apiserver_process(p, kube, work))
            legs = {"agent": (session(aurl, p.agent_client_ssl()), "/v1/copy", True),
                    "relay": (session(url, p.user_ssl()),
                              f"{GV}/watch/namespaces/default/pods/box/copy", False)}
            pids = {"agent": apid, "relay": api.pid, "client": os.getpid()}
            await asyncio.sleep(SETTLE_S)  # no inode freed just before (see above)
            conn = await stack.enter_async_context(
                await Connection.from_kubeconfig(ncp_kubeconfig(p, work, url)))
            for _ in range(rounds):
                if "e2e" in legs_wanted:
                    for way in ("built", "streamed"):
                        n += 1
                        before = {k: cpu_seconds(v) for k, v in pids.items()}
                        before["agent loop"] = cpu_seconds(f"{apid}/task/{apid}")
                        t = time.perf_counter()
                        packed = await pack_dir(src)
                        if way == "built":  # as before streaming: the tar kept first
                            await build_first(packed)
                        res = await upload_dir(conn, src, RemotePath("default", "box", f"/t{n}",
                                                                     "app"), packed=packed)
                        wall = time.perf_counter() - t
                        assert res.entries == len(listing.entries)
                        used = {k: cpu_seconds(v) - before[k] for k, v in pids.items()}
                        used["agent loop"] = (cpu_seconds(f"{apid}/task/{apid}")
                                              - before["agent loop"])
                        key = f"e2e {way}"
                        total = used["agent"] + used["relay"] + used["client"]
                        print(f"  {key}: agent {used['agent']:.2f} client {used['client']:.2f}"
                              f" total {total:.2f} CPU-s, wall {wall:.2f} s",
                              file=sys.stderr, flush=True)
                        runs.setdefault(key, []).append({**used, "wall": wall})
                for leg, (s, path, direct) in legs.items():
                    if leg not in legs_wanted:
                        continue
                    for way in ways:
                        n += 1
                        target = f"/t{n}"
                        gen, claim = body_of(way, src, listing, kept)
                        sha = (wire.SHA256_HEADERS_PREFIX + headers_hex if claim
                               else wire.SHA256_HEADERS_TRAILER)
                        length = size + (0 if claim else wire.SHA256_TRAILER_SIZE)
                        headers = {"Content-Length": str(length),
                                   "Content-Type": "application/x-tar"}
                        if direct:
                            headers["Authorization"] = "Bearer " + signer.sign(
                                node=NODE, subject=USER, operation=wire.OP_COPY_UPLOAD,
                                pod_namespace="default", pod_name="box", pod_uid=pod_uid,
                                containers=(ContainerRef("app", "busybox"),), path=target,
                                params={"format": "tar"})
                        spy = await _attach(apid, f"{leg}-{way}-{n}")
                        before = {k: cpu_seconds(v) for k, v in pids.items()}
                        before["agent loop"] = cpu_seconds(f"{apid}/task/{apid}")
                        t = time.perf_counter()
                        async with s.post(path, params={"container": "app", "path": target,
                                                        "format": "tar", "sha256": sha},
                                          data=gen(), headers=headers) as r:
                            assert r.status in (200, 201), (leg, way, r.status, await r.text())
                            reply = await r.json()
                        wall = time.perf_counter() - t
                        assert reply["sha256"] == headers_hex, reply
                        used = {k: cpu_seconds(v) - before[k] for k, v in pids.items()}
                        used["agent loop"] = (cpu_seconds(f"{apid}/task/{apid}")
                                              - before["agent loop"])
                        if spy is not None:
                            spy.send_signal(signal.SIGINT)
                            await spy.wait()
                        key = f"{leg} {way}"
                        print(f"  {key}: agent {used['agent']:.2f} CPU-s (loop "
                              f"{used['agent loop']:.2f}), wall {wall:.2f} s",
                              file=sys.stderr, flush=True)
                        runs.setdefault(key, []).append({**used, "wall": wall})
    finally:
        for s in sessions:
            await s.close()
        await kube.stop()
    gib = size / (1 << 30)
    return {k: {kk: (vv if kk == "wall" else vv / gib) for kk, vv in v.items()}
            for k, v in ((k, {c: statistics.median(r[c] for r in rs) for c in rs[0]})
                         for k, rs in runs.items())}


def report(files: int, kib: int, rounds: int, res: dict[str, dict[str, float]]) -> None:
    print(f"tar upload of {files} x {kib} KiB files, median of {rounds} interleaved round(s); "
          "CPU-s per GiB of tar")
    print(f"{'':>16} {'agent':>7} {'(loop)':>7} {'relay':>7} {'client':>7} {'wall s':>7}")
    for key, v in res.items():
        relay = f"{v['relay']:>7.2f}" if not key.startswith("agent") else f"{'-':>7}"
        print(f"{key:>16} {v['agent']:>7.2f} {v['agent loop']:>7.2f} {relay} "
              f"{v['client']:>7.2f} {v['wall']:>7.2f}")
    for leg in ("agent", "relay"):
        if f"{leg} streamed" not in res or f"{leg} whole" not in res:
            continue
        ratio = res[f"{leg} streamed"]["agent"] / res[f"{leg} whole"]["agent"]
        print(f"goal ({leg} leg) agent CPU streamed <= {GOAL}x whole: {ratio:.2f}x -> "
              f"{'met' if ratio <= GOAL else 'NOT met'}")
    if "e2e streamed" in res and "e2e built" in res:
        b, st = res["e2e built"], res["e2e streamed"]

        def total(v: dict[str, float]) -> float:
            return v["agent"] + v["relay"] + v["client"]
        print(f"e2e upload_dir: streamed {st['wall']:.2f} s vs built first "
              f"{b['wall']:.2f} s ({b['wall'] / st['wall']:.2f}x); CPU-s/GiB client+relay+"
              f"agent {total(st):.1f} vs {total(b):.1f} -> streaming "
              f"{'cheaper' if total(st) <= total(b) and st['wall'] <= b['wall'] else 'NOT'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=10000)
    ap.add_argument("--file-kib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ways", default=",".join(WAYS), help="comma-separated, of " + ", ".join(WAYS))
    ap.add_argument("--legs", default="agent,relay,e2e",
                    help="agent (straight), relay, e2e (upload_dir through the relay, "
                    "built first vs streamed: client+relay+agent CPU and wall)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-upload-stream-"))
    try:
        res = eventloop.run(run(args.files, args.file_kib, args.rounds, work,
                                   args.ways.split(","), args.legs.split(",")))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(args.files, args.file_kib, args.rounds, res)


if __name__ == "__main__":
    main()
