"""bench_copy's servers, each in a child process of its own (``python3 -m
benchmarks.bench_copy --serve KIND``, so its RSS holds only what that server imports):
the raw TLS baseline, the real agent app, the front-proxy stand-in."""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from aggapi.serve import site as serving
from benchmarks._copyrig import CHUNK, NODE, PROXY_TOKEN, USER, Pki, stop_process


async def _proxy_main(backend: str, cert: str, key: str, ca: str) -> None:
    from tests.framework.frontproxy import FrontProxy, ProxyUser

    proxy = FrontProxy(backend, client_cert=cert, client_key=key, backend_ca=ca,
                       users={PROXY_TOKEN: ProxyUser(USER, groups=("devs",))})
    _announce(await proxy.start())
    await asyncio.Event().wait()


@asynccontextmanager
async def front_proxy_process(p: Pki, backend: str) -> AsyncIterator[tuple[str, int]]:
    """The aggregator stand-in in its own process; yields (url, pid)."""
    async with child("proxy", backend, p.path("fp.crt"), p.path("fp.key"),
                     p.path("ca.crt")) as (url, pid):
        yield url, pid



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


async def _baseline_main(cert: str, key: str) -> None:
    app = web.Application(client_max_size=1 << 40)
    app.router.add_post("/sink", _sink)
    app.router.add_get("/source", _source)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    _announce(f"https://127.0.0.1:{runner.addresses[0][1]}")
    await asyncio.Event().wait()


class _DirResolver:
    """The pod's container root is a plain directory."""

    def __init__(self, root: str, pod_uid: str) -> None:
        self.root, self.pod_uid = root, pod_uid

    async def resolve(self, pod_uid: str, container: str) -> Any:
        from aggapi.agent.copy.fsroot import FsRoot
        return FsRoot(os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                      container_id="bench", pod_uid=pod_uid, container_name=container)

    async def by_id(self, container_id: str) -> Any:
        return None


async def _agent_main(pki_dir: str, root: str, state_dir: str, pod_uid: str) -> None:
    """The real agent app (auth middleware, copy handlers), container root = ``root``."""
    from aggapi.agent.app import build_app, new_parts
    from aggapi.agent.auth import server_context
    from aggapi.agent.config import AgentConfig
    from aggapi.agent.copy.quotas import CopyLimits
    from aggapi.auth.capability import CapabilityVerifier

    d = Path(pki_dir)
    config = AgentConfig(node_name=NODE, tls_cert=str(d / "agent.crt"),
                         tls_key=str(d / "agent.key"), client_ca=str(d / "ca.crt"),
                         token_public_key=str(d / "token-signing.pub"), host="127.0.0.1",
                         port=0, kubelet_config="/nonexistent",
                         copy=CopyLimits(size_limit=1 << 40, state_dir=state_dir))
    verifier = CapabilityVerifier((d / "token-signing.pub").read_bytes(), NODE)
    # No CRI here: pod_check off, and the copy resolver swapped for the directory.
    parts = new_parts(config, cri=None, containerd=None,  # type: ignore[arg-type]
                      verifier=verifier, copy_resolver=_DirResolver(root, pod_uid))
    app = build_app(parts, pod_check=False)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           read_bufsize=serving.READ_BUFSIZE)  # as aggapi.agent.main
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_context(
        config.tls_cert, config.tls_key, config.client_ca))
    await site.start()
    _announce(f"https://127.0.0.1:{runner.addresses[0][1]}")
    await asyncio.Event().wait()


SERVERS: dict[str, Callable[..., Coroutine[Any, Any, None]]] = {
    "baseline": _baseline_main, "agent": _agent_main, "proxy": _proxy_main}


def _announce(url: str) -> None:
    print(url, flush=True)


@asynccontextmanager
async def child(kind: str, *args: str) -> AsyncIterator[tuple[str, int]]:
    """``python3 -m benchmarks.bench_copy --serve KIND ARGS...`` (a fresh interpreter, so
    its RSS holds only what that server imports); yields (url, pid)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.bench_copy", "--serve", kind, *args,
        stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        if not line:
            raise RuntimeError(f"{kind} server exited with {await proc.wait()}")
        yield line.decode().strip(), proc.pid
    finally:
        await stop_process(proc)
