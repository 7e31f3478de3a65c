"""The agent told to stop (what SIGTERM does in aggapi.agent.main.serve) mid-upload, on the
real agent app (mTLS, capability, the copy engine writing into a directory): /readyz fails
at once; an upload that cannot finish before the drain deadline is answered 503 +
Retry-After while its client still has most of its body to send, the target unchanged
and no temp file left; a new copy is refused with a 503 (issue 35 item 1). At 95095d5 the
agent had no drain: the upload went on taking its body until the process was killed."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggapi import wire
from aggapi.agent import main as agent_main
from aggapi.agent.app import PARTS, AgentParts, build_app, new_parts
from aggapi.agent.config import AgentConfig, from_args
from aggapi.auth.capability import CapabilitySigner, CapabilityVerifier, ContainerRef
from tests.agent.agentserver import NODE, client_ssl, pki, run_agent
from tests.agent.copy.conftest import POD_UID, DirResolver
from tests.agent.fakectd import FakeContainerd
from tests.agent.test_agent_health import AnsweringCRI
from tests.agent.test_agent_main import free_port, wait_up

MiB = 1 << 20


async def test_stop_ends_an_upload_that_cannot_finish_and_refuses_new_ones(
        tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp/target").write_bytes(b"original")
    total = 256 * MiB
    sent = 0
    first = asyncio.Event()
    async with run_agent(pki(tmp_path / "pki"), cri=AnsweringCRI(),
                         containerd=FakeContainerd(), pod_check=False,
                         copy_resolver=DirResolver(root)) as agent:
        drain = agent.app[PARTS].drain

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            chunk = b"y" * MiB
            while sent < total:
                if sent >= 2 * MiB:
                    first.set()
                    await asyncio.sleep(0.05)  # a slow client: about 20 MiB/s from here
                yield chunk
                sent += len(chunk)

        async def upload() -> tuple[int, dict[str, str], dict[str, object]]:
            async with agent.copy("POST", "/tmp/target", uid=POD_UID, images=["busybox"],
                                  container="c0", data=body(),
                                  headers={"Content-Length": str(total)}) as resp:
                return resp.status, dict(resp.headers), json.loads(await resp.read())

        up = asyncio.create_task(upload())
        async with asyncio.timeout(30):
            await first.wait()
        for _ in range(1000):  # the agent is writing it (its temp file is there)
            if drain.transfers and len(list((root / "tmp").iterdir())) > 1:
                break
            await asyncio.sleep(0.01)
        drain.start(2.0)  # 250 MiB to go at ~20 MiB/s: not within 2 s
        async with aiohttp.ClientSession() as s, s.get(agent.health_url + "/readyz") as r:
            assert r.status == 500
            assert "[-]shutdown failed: draining copies" in await r.text()
        async with asyncio.timeout(30):
            status, headers, st = await up
        sent_at_answer = sent
        await drain.idle()
        assert status == 503, st["message"]
        assert headers["Retry-After"] == "1" and st["code"] == 503
        assert sent_at_answer < 64 * MiB, f"{sent_at_answer / MiB:.0f} MiB taken"
        assert drain.ended_early == 1, st["message"]
        assert (root / "tmp/target").read_bytes() == b"original"
        assert sorted(p.name for p in (root / "tmp").iterdir()) == ["target"]
        # Draining: a new copy is refused, retryable.
        async with agent.copy("POST", "/tmp/other", uid=POD_UID, images=["busybox"],
                              container="c0", data=b"z" * 1000) as resp:
            assert resp.status == 503 and resp.headers["Retry-After"] == "1"
        assert not (root / "tmp/other").exists()


async def test_sigterm_path_answers_the_upload_and_stops_the_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """aggapi.agent.main.serve itself, its stop event set as the SIGTERM handler sets it:
    the slow upload is answered 503 after a few more MiB, and serve returns (the agent
    exits) instead of waiting on the copy. At 95095d5 this test times out: measured once
    with the same set-up, a client sending 30 MiB/s had no answer 30 s after SIGTERM and
    had poured 900 MiB more into the agent, which was still running."""
    certs = pki(tmp_path / "pki")
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    (root / "tmp/target").write_bytes(b"original")

    class Runtime(AnsweringCRI):
        async def close(self) -> None:
            pass

    class Ctd(FakeContainerd):
        async def close(self) -> None:
            pass

    async def connect(config: AgentConfig, identity: object = None) -> AgentParts:
        verifier = CapabilityVerifier((certs / "token-signing.pub").read_bytes(), NODE)
        cri: Any = Runtime()
        ctd: Any = Ctd()
        return new_parts(config, cri=cri, containerd=ctd, verifier=verifier,
                         copy_resolver=DirResolver(root))

    monkeypatch.setattr(agent_main, "connect", connect)
    monkeypatch.setattr(agent_main, "build_app", functools.partial(build_app, pod_check=False))
    port = free_port()
    config = from_args(["--node-name", NODE, "--certs-dir", str(certs), "--bind-address",
                        "127.0.0.1", "--secure-port", str(port), "--runtime", "cri"])
    stop = asyncio.Event()
    served = asyncio.create_task(agent_main.serve(config, stop))
    try:
        await wait_up(f"https://127.0.0.1:{port}/livez", client_ssl(certs))
        token = CapabilitySigner((certs / "token-signing.key").read_bytes()).sign(
            node=NODE, subject="alice", operation=wire.OP_COPY_UPLOAD,
            pod_namespace="default", pod_name="p", pod_uid=POD_UID,
            containers=[ContainerRef("c0", "busybox")], path="/tmp/target", params={})
        total, sent = 1024 * MiB, 0
        taking = asyncio.Event()

        async def body() -> AsyncIterator[bytes]:
            nonlocal sent
            chunk = b"z" * MiB
            while sent < total:
                yield chunk
                sent += MiB
                if sent >= 4 * MiB:
                    taking.set()
                    await asyncio.sleep(0.03)  # ~30 MiB/s: 34 s in all

        async def upload() -> tuple[int, str | None]:
            async with aiohttp.ClientSession() as s, s.post(
                    f"https://127.0.0.1:{port}/v1/copy",
                    params={"container": "c0", "path": "/tmp/target"},
                    headers={"Authorization": f"Bearer {token}",
                             "Content-Length": str(total)},
                    data=body(), ssl=client_ssl(certs)) as r:
                return r.status, r.headers.get("Retry-After")

        up = asyncio.create_task(upload())
        async with asyncio.timeout(30):  # hang guards, not figures
            await taking.wait()
            for _ in range(1000):  # the agent is writing it
                if len(list((root / "tmp").iterdir())) > 1:
                    break
                await asyncio.sleep(0.01)
            sent_at_term = sent
            stop.set()  # SIGTERM
            assert await up == (503, "1")
            sent_after = sent - sent_at_term
            await served
        assert sent_after < 64 * MiB, f"{sent_after / MiB:.0f} MiB taken after SIGTERM"
        assert (root / "tmp/target").read_bytes() == b"original"
        assert sorted(p.name for p in (root / "tmp").iterdir()) == ["target"]
    finally:
        stop.set()
        if not served.done():
            served.cancel()
