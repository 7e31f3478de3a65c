"""Copy throughput and memory: 1 GiB upload and download through the agent's copy
handlers over real HTTPS on 127.0.0.1, against a raw TLS loopback baseline
(same client, a server that only discards / produces bytes).

The server runs in a child process so its peak RSS (VmHWM) is its own.
Run: ``python3 -m benchmarks.bench_copy [--size-mib 1024]`` (root: the handlers
chown). The apiserver leg is to be added.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import shutil
import ssl
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from aggapi import pki
from aggapi.agent import appkeys
from aggapi.agent.copy import handlers
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.state import CopyState
from aggapi.status import status_middleware

CHUNK = 1 << 20


@dataclass(frozen=True)
class _Ref:
    name: str


@dataclass(frozen=True)
class _Cap:
    operation: str
    path: str | None
    pod_uid: str = "bench"
    containers: tuple[_Ref, ...] = (_Ref("c"),)
    params: dict[str, str] = field(default_factory=dict)


class _Resolver:
    def __init__(self, root: str) -> None:
        self.root = root

    async def resolve(self, pod_uid: str, container: str) -> FsRoot:
        return FsRoot(os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))

    async def by_id(self, container_id: str) -> FsRoot | None:
        return None


@web.middleware
async def _cap(request: web.Request, handler: Any) -> web.StreamResponse:
    op = {"GET": "copy.download", "POST": "copy.upload", "HEAD": "copy.stat"}[request.method]
    request[appkeys.CAPABILITY] = _Cap(op, request.query.get("path"))
    resp: web.StreamResponse = await handler(request)
    return resp


async def _sink(request: web.Request) -> web.Response:
    n = 0
    while data := await request.content.read(CHUNK):
        n += len(data)
    return web.json_response({"size": n})


async def _source(request: web.Request) -> web.StreamResponse:
    size = int(request.query["size"])
    resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    resp.content_length = size
    await resp.prepare(request)
    block = b"\0" * CHUNK
    left = size
    while left:
        await resp.write(block[:min(left, CHUNK)])
        left -= min(left, CHUNK)
    return resp


def _rss() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmHWM", "VmRSS")):
                k, v = line.split(":")
                out[k] = int(v.split()[0]) * 1024
    return out


async def _rss_handler(request: web.Request) -> web.Response:
    return web.json_response(_rss())


def _serve(root: str, state_dir: str, cert: str, key: str, port_q: Any) -> None:
    async def main() -> None:
        app = web.Application(middlewares=[status_middleware, _cap], client_max_size=1 << 40)
        app[appkeys.COPY_STATE] = CopyState(
            CopyLimits(size_limit=1 << 40, state_dir=state_dir), _Resolver(root))
        app.router.add_route("HEAD", "/v1/copy", handlers.stat)
        app.router.add_get("/v1/copy", handlers.download, allow_head=False)
        app.router.add_post("/v1/copy", handlers.upload)
        app.router.add_post("/sink", _sink)
        app.router.add_get("/source", _source)
        app.router.add_get("/rss", _rss_handler)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()
    asyncio.run(main())


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


async def _client(base: str, ctx: ssl.SSLContext, size: int) -> dict[str, float]:
    res: dict[str, float] = {}
    mib = size / (1 << 20)
    async with aiohttp.ClientSession(base, connector=aiohttp.TCPConnector(ssl=ctx)) as s:
        t = time.perf_counter()
        async with s.post("/sink", data=_body(size)) as r:
            assert (await r.json())["size"] == size
        res["baseline_upload_MiB_s"] = mib / (time.perf_counter() - t)
        t = time.perf_counter()
        async with s.get("/source", params={"size": str(size)}) as r:
            assert await _drain(r) == size
        res["baseline_download_MiB_s"] = mib / (time.perf_counter() - t)
        t = time.perf_counter()
        async with s.post("/v1/copy", params={"container": "c", "path": "/big"},
                          data=_body(size)) as r:
            assert r.status == 200, await r.text()
        res["copy_upload_MiB_s"] = mib / (time.perf_counter() - t)
        t = time.perf_counter()
        async with s.get("/v1/copy", params={"container": "c", "path": "/big"}) as r:
            assert r.status == 200 and await _drain(r) == size
        res["copy_download_MiB_s"] = mib / (time.perf_counter() - t)
        t = time.perf_counter()  # a resumed download: the digest comes from the cache
        async with s.get("/v1/copy", params={"container": "c", "path": "/big"},
                         headers={"Range": f"bytes={size // 2}-"}) as r:
            assert r.status == 206 and await _drain(r) == size - size // 2
        res["copy_resume_half_s"] = time.perf_counter() - t
        async with s.get("/rss") as r:
            rss = await r.json()
        res["server_peak_rss_MiB"] = rss["VmHWM"] / (1 << 20)
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    args = ap.parse_args()
    size = args.size_mib << 20
    work = tempfile.mkdtemp(prefix="bench-copy-")
    try:
        root = os.path.join(work, "root")
        os.mkdir(root)
        ca = pki.new_ca("bench-ca")
        leaf = pki.issue(ca, "127.0.0.1", ips=["127.0.0.1"], server=True)
        cert, key = os.path.join(work, "tls.crt"), os.path.join(work, "tls.key")
        leaf.write(cert, key)
        q: Any = mp.get_context("spawn").Queue()
        proc = mp.get_context("spawn").Process(
            target=_serve, args=(root, os.path.join(work, "state"), cert, key, q), daemon=True)
        proc.start()
        try:
            port = q.get(timeout=30)
            ctx = ssl.create_default_context(cadata=ca.cert_pem.decode())
            res = asyncio.run(_client(f"https://127.0.0.1:{port}", ctx, size))
        finally:
            proc.terminate()
            proc.join(10)
        print(json.dumps({"size_MiB": args.size_mib, **{k: round(v, 1) for k, v in res.items()}},
                         indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
