"""The agent told to stop (what SIGTERM does in aggapi.agent.main.serve) mid-upload, on the
real agent app (mTLS, capability, the copy engine writing into a directory): /readyz fails
at once; an upload that cannot finish before the drain deadline is answered 503 +
Retry-After while its client still has most of its body to send, the target unchanged
and no temp file left; a new copy is refused with a 503 (issue 35 item 1). At 95095d5 the
agent had no drain: the upload went on taking its body until the process was killed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from aggapi.agent.app import PARTS
from tests.agent.agentserver import pki, run_agent
from tests.agent.copy.conftest import POD_UID, DirResolver
from tests.agent.fakectd import FakeContainerd
from tests.agent.test_agent_health import AnsweringCRI

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
