"""`aggapi apiserver` as a process: kubeconfig, env config, readiness, SIGTERM exit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import sys

import aiohttp

from tests.framework.fakekube import FakeKube
from tests.framework.until import until

from .conftest import Pki


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _start_apiserver(certs: Pki, kube: FakeKube, *args: str,
                           stderr: int) -> tuple[asyncio.subprocess.Process, int]:
    """`aggapi apiserver` on a free 127.0.0.1 port against ``kube``, configured through
    its environment, with ``args`` added; returns the process and its port."""
    kubeconfig = certs.dir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
        "users": [{"name": "me", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "me"}}]}))
    port = _free_port()
    env = {**os.environ, "AGGAPI_SECURE_PORT": str(port), "AGGAPI_BIND_ADDRESS": "127.0.0.1",
           "AGGAPI_TLS_CERT_FILE": certs.path("tls.crt"),
           "AGGAPI_TLS_PRIVATE_KEY_FILE": certs.path("tls.key"), "AGGAPI_SHUTDOWN_GRACE": "1"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "aggapi", "apiserver", "--kubeconfig", str(kubeconfig), *args,
        env=env, stderr=stderr)
    return proc, port


async def test_process_serves_and_exits_on_sigterm(certs: Pki, kube: FakeKube) -> None:
    proc, port = await _start_apiserver(certs, kube, stderr=asyncio.subprocess.PIPE)
    try:
        ctx = ssl.create_default_context(cafile=certs.path("serving-ca.crt"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async def ready() -> bool:
                try:
                    async with s.get(f"https://127.0.0.1:{port}/readyz") as resp:
                        return resp.status == 200
                except aiohttp.ClientConnectionError:
                    return False
            await until(ready, within=20)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        assert proc.stderr is not None
        lines = [json.loads(line) for line in (await proc.stderr.read()).splitlines()]
        assert any(e["msg"] == "serving" and e["port"] == port for e in lines)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_shutdown_delay_keeps_accepting_while_not_ready(certs: Pki, kube: FakeKube) -> None:
    """--shutdown-delay: after SIGTERM /readyz fails at once (endpoints drop the replica)
    while the port still answers; the process exits after the delay."""
    proc, port = await _start_apiserver(certs, kube, "--shutdown-delay=3",
                                        stderr=asyncio.subprocess.DEVNULL)
    try:
        ctx = ssl.create_default_context(cafile=certs.path("serving-ca.crt"))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s:
            async def readyz() -> int:
                try:
                    async with s.get(f"https://127.0.0.1:{port}/readyz",
                                     headers={"Connection": "close"}) as resp:
                        return resp.status
                except aiohttp.ClientConnectionError:
                    return 0

            async def ready() -> bool:
                return await readyz() == 200

            async def draining() -> bool:
                return await readyz() not in (0, 200)

            await until(ready, within=20)
            proc.send_signal(signal.SIGTERM)
            # A new connection is still answered, and says not ready.
            await until(draining, within=2)
            assert proc.returncode is None
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
