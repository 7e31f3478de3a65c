"""Copies to a real runc container that fail midway: the agent (a real ``python3 -m
aggapi agent`` process) SIGKILLed mid-upload, and its start-up cleanup on restart, also
after the pod's container was replaced; the container stopped through CRI mid-download
and mid-upload."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.auth.capability import CapabilitySigner
from aggapi.runtime.cri import CRIClient
from tests.agent.agentserver import NODE, Agent, client_ssl, pki, run_agent
from tests.agent.copy.conftest import HeldBody, temp_leftovers
from tests.agent.copy.runcsupport import POD, wait_for
from tests.framework.containerd import Containerd
from tests.framework.pods import ContainerSpec, PodRunner
from tests.framework.repo import REPO

# --- the agent process killed mid-upload ----------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class AgentProcess:
    """``python3 -m aggapi agent`` as the DaemonSet runs it; a fresh port per start."""

    def __init__(self, pki_dir: Path, containerd: Containerd, state: Path, log: Path) -> None:
        self.pki = pki_dir
        self.log = log
        self.args = [sys.executable, "-m", "aggapi", "agent", "--node-name", NODE,
                     "--certs-dir", str(pki_dir), "--bind-address", "127.0.0.1",
                     "--cri-address", containerd.address,
                     "--containerd-address", containerd.address,
                     "--kubelet-config", "/nonexistent", "--copy-state-dir", str(state)]
        self.proc: subprocess.Popen[bytes] | None = None
        signer = CapabilitySigner((pki_dir / "token-signing.key").read_bytes())
        self.client = Agent("", pki_dir, signer, web.Application())

    def spawn(self, port: int) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as out:
            return subprocess.Popen([*self.args, "--secure-port", str(port)], cwd=REPO,
                                    stdout=out, stderr=subprocess.STDOUT)

    async def start(self, timeout: float = 30.0) -> None:
        """Returns once /healthz answers, i.e. after on_startup (and its cleanup) ran."""
        ctx = client_ssl(self.pki)
        for _attempt in range(3):  # another process may grab the free port first
            port = free_port()
            self.client.url = f"https://127.0.0.1:{port}"
            log_start = self.log.stat().st_size if self.log.exists() else 0
            self.proc = self.spawn(port)
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None:
                with contextlib.suppress(aiohttp.ClientError, ssl.SSLError, OSError):
                    async with aiohttp.ClientSession() as s, s.get(
                            self.client.url + "/healthz", ssl=ctx) as r:
                        if r.status == 200:
                            return
                if time.monotonic() > deadline:
                    pytest.fail("agent did not start:\n" + self.log.read_text()[-3000:])
                await asyncio.sleep(0.1)
            out = self.log.read_bytes()[log_start:].decode(errors="replace")
            if "address already in use" not in out.lower():
                pytest.fail(f"agent exited with {self.proc.returncode}:\n{out[-3000:]}")
        pytest.fail("agent could not bind a port")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        self.proc = None


async def test_agent_killed_mid_upload_leaves_target_and_cleans_up_on_restart(
        pods: PodRunner, busybox_image: str, containerd: Containerd,
        agent_dirs: dict[str, Path], tmp_path: Path) -> None:
    data, state = agent_dirs["data"], agent_dirs["state"]
    (data / "target").write_bytes(b"old content")
    (data / "bystander.aggapi-tmp-x").write_bytes(b"not a temp of ours")
    pod = await pods.run_pod(POD, [ContainerSpec("c0", busybox_image,
                                                 mounts=[(str(data), "/data", False)])])
    agent = AgentProcess(pki(tmp_path / "pki"), containerd, state, tmp_path / "agent.log")
    await agent.start()
    try:
        async def upload() -> None:
            body = HeldBody(3)  # never released: the agent dies first
            async with agent.client.copy("POST", "/data/target", uid=pod.uid,
                                         images=[busybox_image], data=body.chunks()) as r:
                await r.read()

        task = asyncio.create_task(upload())

        def temps() -> list[Path]:
            return [p for p in data.iterdir() if p.name.startswith(".aggapi-tmp-")]

        await wait_for(lambda: bool(temps()) and temps()[0].stat().st_size >= 2 << 20,
                       what="the upload's temp file to fill")
        assert [p.suffix for p in state.iterdir()] == [".jsonl"]  # its in-flight record
        agent.kill()
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(task, 10)
        assert (data / "target").read_bytes() == b"old content"
        left = temps()
        assert len(left) == 1 and left[0].stat().st_size >= 2 << 20

        await agent.start()  # same state dir: start-up cleanup
        assert temps() == []
        assert (data / "target").read_bytes() == b"old content"
        assert (data / "bystander.aggapi-tmp-x").read_bytes() == b"not a temp of ours"
        assert os.listdir(state) == []
        # The restarted agent works on the same container.
        async with agent.client.copy("POST", "/data/target", uid=pod.uid,
                                     images=[busybox_image], data=b"new content") as r:
            assert r.status == 200, await r.text()
        assert (data / "target").read_bytes() == b"new content"
    finally:
        agent.kill()


# --- the container stops mid-copy -----------------------------------------------------------

async def test_container_stopped_mid_download_and_mid_upload(
        pods: PodRunner, cri: CRIClient, busybox_image: str, agent_dirs: dict[str, Path],
        tmp_path: Path) -> None:
    data, state = agent_dirs["data"], agent_dirs["state"]
    big = os.urandom(32 << 20)
    (data / "big").write_bytes(big)
    (data / "target").write_bytes(b"before")
    mounts = [(str(data), "/data", False)]
    pod = await pods.run_pod(POD, [ContainerSpec("c0", busybox_image, mounts=mounts),
                                   ContainerSpec("c1", busybox_image, mounts=mounts)])
    images = [busybox_image, busybox_image]
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=None,
                         copy=CopyLimits(state_dir=str(state))) as agent:
        # Download from c0, read slowly; c0 is stopped after the first MiB.
        got = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async with agent.copy("GET", "/data/big", uid=pod.uid, images=images,
                                  container="c0") as r:
                assert r.status == 200
                assert r.content_length == len(big)
                got = await r.content.readexactly(1 << 20)
                await cri.stop_container(pod.containers["c0"], grace=0)
                while chunk := await r.content.read(1 << 20):
                    got += chunk
        assert len(got) < len(big)  # cut, and the client knows it
        assert got == big[:len(got)]

        # Upload into c1; c1 is stopped once the temp file is being written.
        body = HeldBody()

        async def upload() -> tuple[int, dict[str, Any]]:
            async with agent.copy("POST", "/data/target", uid=pod.uid, images=images,
                                  container="c1", data=body.chunks()) as r:
                return r.status, await r.json()

        task = asyncio.create_task(upload())
        await body.sent.wait()
        await wait_for(lambda: bool(temp_leftovers(data)), what="the upload's temp file")
        await cri.stop_container(pod.containers["c1"], grace=0)
        body.release.set()
        status, doc = await asyncio.wait_for(task, 30)
    assert status == 409, doc
    assert doc["kind"] == "Status" and doc["code"] == 409 and "exited" in doc["message"], doc
    assert (data / "target").read_bytes() == b"before"
    assert temp_leftovers(data) == []
    assert sorted(os.listdir(data)) == ["big", "target"]
    assert os.listdir(state) == []


async def test_restart_cleanup_finds_the_pods_new_container(
        pods: PodRunner, busybox_image: str, containerd: Containerd,
        agent_dirs: dict[str, Path], tmp_path: Path) -> None:
    """The agent dies mid-upload into a volume; while it is down the pod's container is
    replaced (kubelet recreated the sandbox: same pod uid, same volume, new container
    id). The temp file is in the volume, which outlived the container: the restarted
    agent must still remove it."""
    data, state = agent_dirs["data"], agent_dirs["state"]
    (data / "target").write_bytes(b"old content")
    spec = ContainerSpec("c0", busybox_image, mounts=[(str(data), "/data", False)])
    pod = await pods.run_pod(POD, [spec])
    agent = AgentProcess(pki(tmp_path / "pki"), containerd, state, tmp_path / "agent.log")
    await agent.start()
    try:
        async def upload() -> None:
            body = HeldBody(1)  # never released: the agent dies first
            async with agent.client.copy("POST", "/data/target", uid=pod.uid,
                                         images=[busybox_image], data=body.chunks()) as r:
                await r.read()

        task = asyncio.create_task(upload())
        await wait_for(lambda: bool(temp_leftovers(data)), what="the upload's temp file")
        agent.kill()
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(task, 10)
        assert len(temp_leftovers(data)) == 1
        await pods.remove_pod(pod)
        again = await pods.run_pod(POD, [spec], uid=pod.uid)
        assert again.containers["c0"] != pod.containers["c0"]
        await agent.start()
        assert temp_leftovers(data) == []
        assert (data / "target").read_bytes() == b"old content"
        assert os.listdir(state) == []
    finally:
        agent.kill()
