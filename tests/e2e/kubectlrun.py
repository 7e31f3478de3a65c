"""Real kubectl (and a plain HTTPS GET) against the e2e control plane, as a user: whole
replies, and ``kubectl get --raw`` streams read line by line."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.framework.controlplane import ControlPlane, binary


@dataclass
class KubectlRun:
    rc: int
    out: bytes
    err: str
    seconds: float

    def objects(self) -> list[dict[str, Any]]:
        """stdout as NDJSON; every line must parse (a truncated stream would not)."""
        import json

        return [json.loads(line) for line in self.out.decode().splitlines() if line.strip()]


def kubectl_argv(cp: ControlPlane, user: str | None, *args: str,
                 kubeconfig: Path | None = None) -> list[str]:
    kc = kubeconfig or (cp.admin_kubeconfig if user is None else cp.user_kubeconfig(user))
    return [binary("kubectl", build=False), f"--kubeconfig={kc}", *args]


async def kubectl(cp: ControlPlane, *args: str, user: str | None = "alice",
                  stdin: bytes | None = None, timeout: float = 120,
                  kubeconfig: Path | None = None) -> KubectlRun:
    """Run real kubectl as ``user`` (None: admin); binary-safe stdout."""
    import asyncio

    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *kubectl_argv(cp, user, *args, kubeconfig=kubeconfig),
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode is not None
    return KubectlRun(proc.returncode, out, err.decode(errors="replace"),
                      time.monotonic() - t0)


@dataclass
class ApiReply:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def api_get(cp: ControlPlane, path: str, *, user: str = "alice",
                  timeout: float = 30) -> ApiReply:
    """GET ``path`` on kube-apiserver over HTTPS as ``user`` (their kubeconfig's client
    certificate), once: status, headers and body as they came, with no client retry."""
    import asyncio

    import aiohttp

    from aggapi.kube.kubeconfig import load_kubeconfig

    cfg = await asyncio.to_thread(load_kubeconfig, str(cp.user_kubeconfig(user)))
    assert cfg.ssl_context is not None  # the harness's kube-apiserver speaks only HTTPS
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as s, \
            s.get(cfg.server + path, ssl=cfg.ssl_context) as r:
        return ApiReply(r.status, dict(r.headers), await r.read())


@dataclass
class Streamed:
    """A ``kubectl get --raw`` stream read line by line: (seconds since start, object)."""

    rc: int
    lines: list[tuple[float, dict[str, Any]]]
    raw: bytes
    err: str
    seconds: float

    @property
    def objects(self) -> list[dict[str, Any]]:
        return [o for _, o in self.lines]


async def kubectl_stream(cp: ControlPlane, path: str, *, user: str = "alice",
                         timeout: float = 300) -> Streamed:
    import asyncio
    import json

    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *kubectl_argv(cp, user, "get", "--raw", path), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, limit=1 << 22)
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[tuple[float, dict[str, Any]]] = []
    raw = bytearray()

    async def read() -> None:
        assert proc.stdout is not None
        async for line in proc.stdout:
            raw.extend(line)
            if line.strip():
                # json.loads fails loudly on a line cut in the middle.
                lines.append((time.monotonic() - t0, json.loads(line)))

    try:
        _, err = await asyncio.wait_for(asyncio.gather(read(), proc.stderr.read()), timeout)
        await proc.wait()
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    assert proc.returncode is not None
    return Streamed(proc.returncode, lines, bytes(raw), err.decode(errors="replace"),
                    time.monotonic() - t0)
