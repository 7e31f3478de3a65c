"""Copies act as the container's user, against a real runc container started through CRI
with ``runAsUser: 1000`` / ``runAsGroup: 1000`` (finding 9), through the agent's real HTTPS
API with capability tokens; and with ``--copy-as-root``, root behaviour returns.

The container's tree is prepared from the host through /proc/<pid>/root: a 0600
root-owned secret, a root-owned 0755 directory and a home owned by 1000.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest_asyncio

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.runtime.cri import CRIClient
from tests.agent.agentserver import pki, run_agent
from tests.agent.copy.runcsupport import POD, container_pid
from tests.framework.pods import ContainerSpec, PodRunner, RunningPod
from tests.tarcraft import pax_tar


@dataclass
class UserPod:
    pod: RunningPod
    rootfs: Path  # /proc/<pid>/root of the container


@pytest_asyncio.fixture
async def user_pod(pods: PodRunner, cri: CRIClient, busybox_image: str) -> AsyncIterator[UserPod]:
    pod = await pods.run_pod(POD, [ContainerSpec("c0", busybox_image, run_as_user=1000,
                                                 run_as_group=1000)])
    pid = await container_pid(cri, pod.containers["c0"])
    yield UserPod(pod, await asyncio.to_thread(prepare, pid))


def prepare(pid: int) -> Path:
    """Lay out the container's tree from the host; returns its /proc/<pid>/root."""
    rootfs = Path(f"/proc/{pid}/root")
    status = Path(f"/proc/{pid}/status").read_text()
    assert "\nUid:\t1000\t1000\t1000\t1000\n" in status, status  # runAsUser took
    (rootfs / "secret").write_bytes(b"root only\n")
    (rootfs / "secret").chmod(0o600)
    (rootfs / "rootdir").mkdir(mode=0o755)
    (rootfs / "home").mkdir(mode=0o755, exist_ok=True)
    (rootfs / "home" / "user").mkdir(mode=0o755)
    os.chown(rootfs / "home" / "user", 1000, 1000)
    return rootfs


async def send(agent: Any, session: Any, pod: RunningPod, image: str, method: str, path: str,
               data: bytes | None = None, params: dict[str, str] | None = None) -> tuple[int,
                                                                                           bytes]:
    async with agent.copy(method, path, uid=pod.uid, images=[image], data=data,
                          params=params, session=session) as r:
        return r.status, await r.read()


async def test_run_as_user_1000_container(user_pod: UserPod, cri: CRIClient,
                                          busybox_image: str, tmp_path: Path) -> None:
    up, fs = user_pod, user_pod.rootfs
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=None,
                         copy=CopyLimits(state_dir=str(tmp_path / "state"))) as agent, \
            agent.session() as session:
        status, body = await send(agent, session, up.pod, busybox_image, "GET", "/secret")
        assert status == 403, body
        assert b"root only" not in body and b'"kind":"Status"' in body.replace(b" ", b"")

        status, body = await send(agent, session, up.pod, busybox_image, "POST",
                                  "/rootdir/new", b"x")
        assert status == 403, body
        status, body = await send(agent, session, up.pod, busybox_image, "POST",
                                  "/rootdir/t", pax_tar({"a": b"a"}), {"format": "tar"})
        assert status == 403, body
        assert os.listdir(fs / "rootdir") == []

        status, body = await send(agent, session, up.pod, busybox_image, "POST",
                                  "/home/user/notes", b"mine")
        assert status == 200, body
        st = (fs / "home" / "user" / "notes").stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000)
        assert (fs / "home" / "user" / "notes").read_bytes() == b"mine"

        status, body = await send(agent, session, up.pod, busybox_image, "POST",
                                  "/home/user/notes", b"root's", {"uid": "0"})
        assert status == 403, body
        assert (fs / "home" / "user" / "notes").read_bytes() == b"mine"
        assert os.listdir(tmp_path / "state") == []


async def test_copy_as_root_returns_root_behaviour(user_pod: UserPod, cri: CRIClient,
                                                   busybox_image: str, tmp_path: Path) -> None:
    up, fs = user_pod, user_pod.rootfs
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=None,
                         copy=CopyLimits(state_dir=str(tmp_path / "state")),
                         copy_as_root=True) as agent, \
            agent.session() as session:
        status, body = await send(agent, session, up.pod, busybox_image, "GET", "/secret")
        assert (status, body) == (200, b"root only\n")
        status, body = await send(agent, session, up.pod, busybox_image, "POST",
                                  "/rootdir/new", b"x")
        assert status == 200, body
        assert (fs / "rootdir" / "new").stat().st_uid == 0
