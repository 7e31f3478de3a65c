"""The agent's probes: /readyz fails, and says why, while the runtime does not answer;
/livez does not ask the runtime. Real CRI and containerd clients on socket paths
that do not exist (unit); the real containerd (integration)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from aggapi.agent.app import PARTS
from aggapi.agent.config import from_args
from aggapi.agent.health import ReadinessChecks
from aggapi.runtime.containerd import ContainerdClient
from aggapi.runtime.cri import CRIClient, RuntimeVersion
from tests.agent.agentserver import Agent, pki, run_agent
from tests.agent.fakectd import FakeContainerd


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class AnsweringCRI:
    """Answers Version (and lists no sandboxes): a CRI that is up."""

    def __init__(self) -> None:
        self.versions = 0

    async def version(self) -> RuntimeVersion:
        self.versions += 1
        return RuntimeVersion("fake", "1.0", "v1")

    async def list_pod_sandboxes(self, labels: Mapping[str, str] | None = None) -> list[Any]:
        return []


async def probe(agent: Agent, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.get(agent.health_url + path) as resp:
        return resp.status, await resp.text()


async def test_results_are_cached_for_the_ttl_and_shared() -> None:
    calls = 0

    async def check() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)

    clock = Clock()
    checks = ReadinessChecks([("a", check)], ttl=1.5, clock=clock)
    await asyncio.gather(*(checks.results() for _ in range(5)))
    assert calls == 1 and checks.rounds == 1  # concurrent probes share one round
    clock.now = 1.4
    assert [r.ok for r in await checks.results()] == [True]
    assert calls == 1
    clock.now = 1.6
    await checks.results()
    assert calls == 2


async def test_a_check_that_hangs_fails_with_its_timeout() -> None:
    never = asyncio.Event()

    async def hang() -> None:
        await never.wait()

    async def broken() -> None:
        raise OSError("socket gone")

    checks = ReadinessChecks([("slow", hang), ("broken", broken)], timeout=0.05)
    results = {r.name: r.error for r in await checks.results()}
    assert results == {"slow": "no answer within 0.05s", "broken": "socket gone"}


async def test_missing_cri_socket_is_not_ready_and_says_why(tmp_path: Path) -> None:
    # CRI-only mode (no containerd client): only the cri check runs.
    cri = CRIClient(str(tmp_path / "no-such.sock"))
    try:
        async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=None,
                             pod_check=False) as agent:
            status, body = await probe(agent, "/readyz")
            assert status == 500 and body.startswith("[-]cri failed: ")
            status, body = await probe(agent, "/readyz?verbose")
            lines = body.splitlines()
            assert status == 500
            assert lines[0].startswith("[-]cri failed: ") and "Version" in lines[0], body
            assert lines[-1] == "readyz check failed"
            assert len(lines) == 2  # no containerd check in CRI-only mode
            assert await probe(agent, "/livez") == (200, "ok")
            assert await probe(agent, "/healthz") == (200, "ok")
    finally:
        await cri.close()


async def test_missing_containerd_socket_fails_only_that_check(tmp_path: Path) -> None:
    cri = AnsweringCRI()
    ctd = ContainerdClient(str(tmp_path / "no-such.sock"))
    try:
        async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=ctd,
                             pod_check=False) as agent:
            status, body = await probe(agent, "/readyz?verbose")
            assert status == 500
            lines = body.splitlines()
            assert lines[0] == "[+]cri ok"
            assert lines[1].startswith("[-]containerd failed: "), body
            assert lines[-1] == "readyz check failed"
    finally:
        await ctd.close()


async def test_ready_runtime_passes_and_probes_do_not_hammer_it(tmp_path: Path) -> None:
    cri = AnsweringCRI()
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=FakeContainerd(),
                         pod_check=False) as agent:
        status, body = await probe(agent, "/readyz?verbose")
        assert status == 200
        assert body.splitlines() == ["[+]cri ok", "[+]containerd ok", "readyz check passed"]
        for _ in range(5):
            assert await probe(agent, "/readyz") == (200, "ok")
        assert cri.versions == 1  # cached: six probes, one Version
        # The mTLS port answers the probes too, with no capability token.
        async with agent.get("/readyz", None) as resp:
            assert resp.status == 200
        assert agent.app[PARTS].readiness.rounds == 1


async def test_real_containerd_is_ready(tmp_path: Path, cri: CRIClient,
                                        ctd: ContainerdClient) -> None:
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=ctd,
                         pod_check=False) as agent:
        status, body = await probe(agent, "/readyz?verbose")
        assert status == 200, body
        assert body.splitlines() == ["[+]cri ok", "[+]containerd ok", "readyz check passed"]


@pytest.mark.parametrize("runtime", ["containerd", "cri"])
def test_flags_reach_the_config(runtime: str) -> None:
    cfg = from_args(["--node-name", "n", "--certs-dir", "/x", "--runtime", runtime,
                     "--metrics-port", "10445", "--metrics-auth", "none"])
    assert (cfg.metrics_port, cfg.metrics_auth, cfg.runtime) == (10445, "none", runtime)
