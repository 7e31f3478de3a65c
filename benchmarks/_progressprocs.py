"""bench_progress's child processes: the 1,000 watchers (``python3 -m
benchmarks.bench_progress --watchers-child``) and ``python3 -m aggapi agent``."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from benchmarks._copyrig import NODE, Pki, stop_process, wait_ready
from benchmarks._progresslatency import watch_path
from tests.framework.containerd import Containerd
from tests.framework.procs import free_port

# --- the 1,000 watchers: a child process ------------------------------------------

async def watchers_main(url: str, pki_dir: str, pods: list[str], n: int) -> None:
    """n streams over ``pods`` (round robin); prints READY once every stream has its
    first line, then DONE with counts when all streams ended (or on stdin EOF)."""
    ctx = ssl.create_default_context(cafile=f"{pki_dir}/ca.crt")
    ctx.load_cert_chain(f"{pki_dir}/user.crt", f"{pki_dir}/user.key")
    counts = {"lines": 0, "summaries": 0, "errors": 0, "status_not_200": 0}
    ready = 0
    all_ready = asyncio.Event()

    async def one(pod: str) -> None:
        nonlocal ready
        first = True
        try:
            async with session.get(watch_path(pod)) as resp:
                if resp.status != 200:
                    counts["status_not_200"] += 1
                    return
                async for line in resp.content:
                    counts["lines"] += 1
                    if first:
                        first = False
                        ready += 1
                        if ready == n:
                            all_ready.set()
                    if b'"kind": "Summary"' in line or b'"kind":"Summary"' in line:
                        counts["summaries"] += 1
        except (aiohttp.ClientError, OSError):
            counts["errors"] += 1
        finally:
            if first:
                ready += 1
                if ready == n:
                    all_ready.set()

    async with aiohttp.ClientSession(
            url, connector=aiohttp.TCPConnector(ssl=ctx, limit=0),
            timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(one(pods[i % len(pods)])) for i in range(n)]
        await all_ready.wait()
        print("READY", flush=True)
        loop = asyncio.get_running_loop()
        eof = loop.run_in_executor(None, sys.stdin.readline)
        done = asyncio.gather(*tasks)
        await asyncio.wait([done, eof], return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print("DONE " + json.dumps(counts), flush=True)


@asynccontextmanager
async def watchers_process(url: str, p: Pki, pods: list[str], n: int
                           ) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bench_progress", "--watchers-child", url,
        str(p.dir), ",".join(pods), str(n),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.stdin is not None and not proc.stdin.is_closing():
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            await stop_process(proc)


async def read_tagged(proc: asyncio.subprocess.Process, tag: str, within: float) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + within
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(),
                                      max(0.1, deadline - time.monotonic()))
        if not line:
            raise RuntimeError(f"watchers process ended before {tag}")
        text = line.decode().strip()
        if text.startswith(tag):
            return text[len(tag):].strip()


# --- the agent process -------------------------------------------------------------

def agent_listen_flags(port: int) -> list[str]:
    """--bind-address/--secure-port, or the older --host/--port: whatever --help shows."""
    help_text = subprocess.run([sys.executable, "-m", "aggapi", "agent", "--help"],
                               capture_output=True, text=True, check=False).stdout
    if "--secure-port" in help_text:
        return ["--bind-address=127.0.0.1", f"--secure-port={port}"]
    return ["--host=127.0.0.1", f"--port={port}"]


@asynccontextmanager
async def agent_process(p: Pki, ctd: Containerd, work: Path, poll_interval: float
                        ) -> AsyncIterator[tuple[str, asyncio.subprocess.Process]]:
    port = free_port()
    log = await asyncio.to_thread((work / "agent.log").open, "wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aggapi", "agent", "--node-name", NODE, "--certs-dir",
        str(p.dir), *agent_listen_flags(port), "--cri-address", ctd.address,
        "--containerd-address", ctd.address, "--snapshotter", ctd.snapshotter,
        "--kubelet-config", "/nonexistent", "--copy-state-dir", str(work / "inflight"),
        f"--poll-interval={poll_interval}", "--log-level=warning", stdout=log, stderr=log)
    url = f"https://127.0.0.1:{port}"
    try:
        await wait_ready(url + "/healthz", p.agent_client_ssl(), proc)
        yield url, proc
    finally:
        await stop_process(proc)
        log.close()
