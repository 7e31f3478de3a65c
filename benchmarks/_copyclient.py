"""bench_copy's client side: the legs it times (aiohttp, 1 MiB chunks, the same for all),
the ncp plugin as a process, py-spy around a transfer, children's CPU."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks._copyrig import CHUNK, USER, Pki


async def _body(size: int) -> AsyncIterator[bytes]:
    block = os.urandom(CHUNK)
    left = size
    while left:
        yield block[:min(left, CHUNK)]
        left -= min(left, CHUNK)


async def _drain(resp: aiohttp.ClientResponse) -> int:
    n = 0
    while data := await resp.content.read(CHUNK):
        n += len(data)
    return n


@dataclass
class Leg:
    name: str
    session: aiohttp.ClientSession
    path: str  # "" for the baseline
    headers: dict[str, str]
    token: Callable[[str, str], str] | None = None  # (operation, path) -> agent token


async def _timed_upload(leg: Leg, size: int, file: str) -> float:
    headers = {**leg.headers, "Content-Length": str(size)}
    if leg.token:
        headers["Authorization"] = "Bearer " + leg.token("copy.upload", file)
    t = time.perf_counter()
    if not leg.path:
        async with leg.session.post("/sink", data=_body(size), headers=headers) as r:
            assert r.status == 200 and (await r.json())["size"] == size
    else:
        async with leg.session.post(leg.path, params={"container": "app", "path": file},
                                    data=_body(size), headers=headers) as r:
            assert r.status in (200, 201), (leg.name, r.status, await r.text())
            assert (await r.json())["size"] == size
    return time.perf_counter() - t


async def _timed_download(leg: Leg, size: int, file: str) -> float:
    headers = dict(leg.headers)
    if leg.token:
        headers["Authorization"] = "Bearer " + leg.token("copy.download", file)
    t = time.perf_counter()
    if not leg.path:
        async with leg.session.get("/source", params={"size": str(size)},
                                   headers=headers) as r:
            assert r.status == 200 and await _drain(r) == size
    else:
        async with leg.session.get(leg.path, params={"container": "app", "path": file},
                                   headers=headers) as r:
            assert r.status == 200, (leg.name, r.status, await r.text())
            assert await _drain(r) == size
    return time.perf_counter() - t


def ncp_kubeconfig(p: Pki, work: Path, server: str) -> str:
    """The user's client certificate straight at the apiserver (no kube-apiserver)."""
    path = work / "ncp.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {
            "server": server, "certificate-authority": p.path("ca.crt")}}],
        "users": [{"name": USER, "user": {"client-certificate": p.path("user.crt"),
                                           "client-key": p.path("user.key")}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": USER}}]}))
    return str(path)


async def _ncp(kubeconfig: str, src: str, dst: str, spy: str | None = None) -> float:
    """One ncp run; ``spy``: under ``py-spy record`` into that file (raw stacks)."""
    argv = [sys.executable, "-m", "aggapi.plugins.ncp", "-q", f"--kubeconfig={kubeconfig}",
            src, dst]
    if spy:
        argv = ["py-spy", "record", "-r", "97", "-n", "-f", "raw", "-o", spy, "--", *argv]
    t = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return time.perf_counter() - t


@asynccontextmanager
async def _spying(leg: str, direction: str, pids: dict[str, int]) -> AsyncIterator[None]:
    """Under ``BENCH_PYSPY=DIR``: py-spy attached to the agent (and, on the apiserver leg,
    the apiserver) for one transfer, its raw stacks written when it is interrupted."""
    out = os.environ.get("BENCH_PYSPY")
    who = {"agent": ["agent"], "apiserver": ["agent", "apiserver"]}.get(leg, [])
    spies = [await asyncio.create_subprocess_exec(
        "py-spy", "record", "-r", "97", "-n", "-f", "raw",
        "-o", f"{out}/{leg}-{direction}-{k}.txt", "--pid", str(pids[k]),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        for k in who] if out else []
    if spies:
        await asyncio.sleep(1)  # attached before the first byte
    try:
        yield
    finally:
        for s in spies:
            s.send_signal(signal.SIGINT)
            await s.wait()


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
