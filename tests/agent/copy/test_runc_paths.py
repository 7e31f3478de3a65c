"""Paths in a real runc container: relative ones start at the container's cwd, and a
busybox loop inside the container swapping /data/d for symlinks to / and to a host
directory while hundreds of copies run (the swapping race is the container's own
command). Pods run through CRI as kubelet runs them; copies go through the agent's real
HTTPS API (see test_runc_escape_corpus.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.runtime.cri import CRIClient
from tests.agent.agentserver import pki, run_agent
from tests.agent.copy.conftest import snapshot, temp_leftovers
from tests.agent.copy.runcsupport import BB, POD, container_pid, wait_for
from tests.framework.pods import ContainerSpec, PodRunner


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def test_relative_paths_start_at_the_containers_cwd(
        pods: PodRunner, cri: CRIClient, busybox_image: str, agent_dirs: dict[str, Path],
        tmp_path: Path) -> None:
    """kubectl cp's relative paths: against the process's cwd as the container sees it
    (readlink of /proc/<pid>/cwd from the host, in runc's own mount namespace), and
    '..' stops at the container root: the container's /etc, never the host's."""
    data, state = agent_dirs["data"], agent_dirs["state"]
    (data / "here").write_bytes(b"in the cwd")
    pod = await pods.run_pod(POD, [ContainerSpec(
        "c0", busybox_image, command=[BB, "sh", "-c", f"cd /data/. && exec {BB} sleep 3600"],
        mounts=[(str(data), "/data", False)])])
    pid = await container_pid(cri, pod.containers["c0"])
    await wait_for(lambda: os.readlink(f"/proc/{pid}/cwd") == "/data", what="cwd /data")
    assert os.readlink(f"/proc/{pid}/root") == "/"  # runc's pivot_root: its own view
    own_passwd = read(f"/proc/{pid}/root/etc/passwd")
    assert own_passwd != read("/etc/passwd")
    limits = CopyLimits(state_dir=str(state))
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=None,
                         copy=limits) as agent, agent.session() as session:

        async def send(method: str, path: str, data: bytes | None = None) -> tuple[int, bytes]:
            async with agent.copy(method, path, uid=pod.uid, images=[busybox_image],
                                  session=session, data=data) as r:
                return r.status, await r.read()

        assert await send("GET", "here") == (200, b"in the cwd")
        status, body = await send("POST", "new", b"uploaded")
        assert status == 200 and json.loads(body)["path"] == "/data/new", body
        assert (data / "new").read_bytes() == b"uploaded"
        assert await send("GET", "../../../../../../etc/passwd") == (200, own_passwd)
        status, body = await send("GET", "../../../../../../etc/shadow")
        assert status in (200, 404) and body != read("/etc/shadow")
    assert os.listdir(state) == []


# --- the swapping race, run by the container itself -----------------------------------------

async def test_symlink_swap_race_in_runc_container(
        pods: PodRunner, cri: CRIClient, busybox_image: str, agent_dirs: dict[str, Path],
        tmp_path: Path) -> None:
    data, outside, state = agent_dirs["data"], agent_dirs["outside"], agent_dirs["state"]
    (outside / "secret").write_bytes(b"HOST SECRET")
    (data / "d").mkdir()
    (data / "d" / "secret").write_bytes(b"container file")
    # Made on the host side of the mount: what the container swaps in for d. "/" and the
    # host path of outside lead out of the container if resolved in the host's view.
    os.symlink("/", data / "l_root")
    os.symlink(str(outside), data / "l_abs")
    os.symlink("../" * (len(data.parts) + 2) + str(outside).lstrip("/"), data / "l_rel")
    outside_before = snapshot(outside)
    host_before = {n for n in os.listdir("/") if n.startswith("up")}
    swap = ("cd /data; while [ ! -e stop ]; do "
            f"{BB} mv d d.real; {BB} mv l_root d; {BB} mv d l_root; "
            f"{BB} mv l_abs d; {BB} mv d l_abs; {BB} mv l_rel d; {BB} mv d l_rel; "
            f"{BB} mv d.real d; done; {BB} touch stopped; exec {BB} sleep 3600")
    pod = await pods.run_pod(POD, [ContainerSpec("c0", busybox_image,
                                                 command=[BB, "sh", "-c", swap],
                                                 mounts=[(str(data), "/data", False)])])
    rootfs = Path(f"/proc/{await container_pid(cri, pod.containers['c0'])}/root")
    rootfs_before = {n for n in os.listdir(rootfs) if n.startswith("up")}
    statuses: dict[int, int] = {}
    uploaded: dict[str, bytes] = {}
    reads: list[int] = []

    limits = CopyLimits(state_dir=str(state), copies_per_pod=64, copies_per_node=64)
    async with run_agent(pki(tmp_path / "pki"), cri=cri, containerd=None,
                         copy=limits) as agent, agent.session() as session:

        async def one(i: int) -> None:
            kind = i % 3
            path = f"/data/d/up{i}" if kind == 0 else "/data/d/secret" if kind == 1 \
                else "/data/d"
            payload = b"upload %d" % i
            async with agent.copy("POST" if kind == 0 else "GET", path, uid=pod.uid,
                                  images=[busybox_image], session=session,
                                  data=payload if kind == 0 else None) as r:
                body = await r.read()
            assert b"HOST SECRET" not in body, path
            if kind == 0 and r.status == 200:
                uploaded[f"up{i}"] = payload
            if kind == 1 and r.status == 200:
                assert body == b"container file"
                reads.append(i)
            statuses[r.status] = statuses.get(r.status, 0) + 1

        def ups(d: Path) -> set[str]:
            try:
                return {n for n in os.listdir(d) if n.startswith("up")}
            except OSError:  # mid-swap: the name is briefly gone or a link elsewhere
                return set()

        def hit_both() -> bool:
            # The real directory is at d or, mid-swap, at d.real.
            return bool((ups(data / "d") | ups(data / "d.real")) & set(uploaded)) and bool(
                (ups(rootfs) - rootfs_before) & set(uploaded))

        # At least 25 rounds; then on until both sides of the swap were hit (which
        # one a write lands on is up to the scheduler: a busy machine can need more).
        for batch in range(150):
            await asyncio.gather(*(one(batch * 12 + i) for i in range(12)))
            if batch >= 24 and hit_both():
                break
    (data / "stop").touch()
    await wait_for((data / "stopped").exists, what="the swap loop to stop")

    assert set(statuses) <= {200, 404, 409}, statuses
    assert uploaded and reads, statuses  # the race really ran, not just refusals
    assert snapshot(outside) == outside_before  # 0 escapes
    assert {n for n in os.listdir("/") if n.startswith("up")} == host_before
    # Every accepted upload is in d or, through d -> /, in the container's own root.
    in_d = {n for n in os.listdir(data / "d") if n.startswith("up")}
    in_root = {n for n in os.listdir(rootfs) if n.startswith("up")} - rootfs_before
    assert in_d | in_root == set(uploaded) and not in_d & in_root
    assert in_d and in_root  # both the real directory and the symlink to / were hit
    for n in in_d:
        assert (data / "d" / n).read_bytes() == uploaded[n]
    for n in in_root:
        assert (rootfs / n).read_bytes() == uploaded[n]
    assert sorted(os.listdir(data)) == ["d", "l_abs", "l_rel", "l_root", "stop", "stopped"]
    assert temp_leftovers(data) == [] and temp_leftovers(rootfs / "tmp") == []
    assert [n for n in os.listdir(rootfs) if n.startswith(".aggapi-tmp-")] == []
    assert os.listdir(state) == []
