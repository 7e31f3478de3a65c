"""The agent as aggapi.agent.main serves it: --read-header-timeout closes half-sent
requests, and the timeout flags reach the server and the copy limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from aggapi.agent.config import from_args
from tests.agent.agentserver import Agent, client_ssl, pki, run_agent
from tests.agent.fakectd import FakeContainerd
from tests.serve.test_site import closed_by_server


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    fake = FakeContainerd()
    fake.now = time.time()
    async with run_agent(pki(tmp_path / "pki"), cri=None, containerd=fake, pod_check=False,
                         read_header_timeout=1.0) as a:
        yield a


async def test_half_sent_request_to_the_agent_is_closed(agent: Agent) -> None:
    port = int(agent.url.rsplit(":", 1)[1])
    ctx = client_ssl(agent.pki)
    r, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    try:
        w.write(b"POST /v1/copy HTTP/1.1\r\nHost: agent\r\n")
        async with agent.get("/healthz", None) as resp:  # others are still served
            assert resp.status == 200
        assert await closed_by_server(r)
    finally:
        w.close()


def test_timeout_flags(tmp_path: Path) -> None:
    base = ["--node-name", "n", "--certs-dir", str(tmp_path)]
    cfg = from_args(base)
    assert (cfg.read_header_timeout, cfg.copy.body_idle_timeout) == (10.0, 60.0)
    cfg = from_args([*base, "--read-header-timeout", "3", "--body-idle-timeout", "7.5"])
    assert (cfg.read_header_timeout, cfg.copy.body_idle_timeout) == (3.0, 7.5)
    for bad in ("-1", "nan", "inf", "soon"):
        with pytest.raises(SystemExit):
            from_args([*base, "--body-idle-timeout", bad])
