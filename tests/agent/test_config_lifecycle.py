"""The agent's flags land in one AgentConfig (copy quotas in its ``copy`` field), and
the app built from its parts starts and stops the copy engine with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from aggapi.agent.app import PARTS, build_app, new_parts
from aggapi.agent.config import AgentConfig, from_args
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.auth.capability import CapabilityVerifier
from tests.agent.agentserver import NODE, pki
from tests.agent.fakectd import FakeContainerd

BASE = ["--node-name", NODE, "--certs-dir", "/certs"]


def test_copy_flags_fill_the_copy_limits() -> None:
    config = from_args([*BASE, "--copy-size-limit", "3Gi", "--copies-per-pod", "2",
                        "--copies-per-node", "9", "--copy-max-entries", "77",
                        "--copy-max-depth", "5", "--copy-state-dir", "/x/inflight",
                        "--copy-direct-io-min-size", "0"])
    assert config.copy == CopyLimits(size_limit=3 << 30, copies_per_pod=2, copies_per_node=9,
                                     max_entries=77, max_depth=5, state_dir="/x/inflight",
                                     direct_io_min_size=0)
    assert config.tls_cert == "/certs/agent.crt"


def test_copy_flags_default_to_the_copy_limits_defaults() -> None:
    assert from_args(BASE).copy == CopyLimits()


def test_a_bad_size_is_refused() -> None:
    with pytest.raises(SystemExit):
        from_args([*BASE, "--copy-size-limit", "-1Gi"])


async def test_cleanup_stops_the_copy_workers(tmp_path: Path) -> None:
    d = pki(tmp_path / "pki")
    config = AgentConfig(node_name=NODE, tls_cert=str(d / "agent.crt"),
                         tls_key=str(d / "agent.key"), client_ca=str(d / "ca.crt"),
                         token_public_key=str(d / "token-signing.pub"),
                         kubelet_config="/nonexistent",
                         copy=CopyLimits(state_dir=str(tmp_path / "inflight")))
    verifier = CapabilityVerifier((d / "token-signing.pub").read_bytes(), NODE)
    parts = new_parts(config, cri=None, containerd=FakeContainerd(),  # type: ignore[arg-type]
                      verifier=verifier)
    app = build_app(parts, pod_check=False)
    assert app[PARTS] is parts
    runner = web.AppRunner(app)
    await runner.setup()
    assert await parts.copy.workers.run(sum, (1, 2)) == 3
    await runner.cleanup()
    with pytest.raises(RuntimeError):
        parts.copy.workers.pool.submit(sum, (1, 2))
