"""Clean re-runs (issue 35): a `kubectl ncp` directory download killed mid-way
(SIGKILL: nothing of it runs again) leaves its private temp directory beside the
target; the next download to that target removes it, while a live run's is never
touched. Real kubectl and the real plugin against the fake cluster."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
from pathlib import Path

import pytest

from tests.client.fakeserver import FakeCluster
from tests.plugins.helpers import KUBECTL, kubectl, plugin_env

FILES = {f"f{i}": os.urandom(50_000) for i in range(40)}


@pytest.fixture
def env(cluster: FakeCluster, plugin_bin: Path) -> dict[str, str]:
    return plugin_env(plugin_bin, cluster.kubeconfig())


def container_dir(cluster: FakeCluster) -> Path:
    d = cluster.pods[("default", "web")].containers["app"] / "data" / "tree"
    d.mkdir(parents=True)
    for name, data in FILES.items():
        (d / name).write_bytes(data)
    return d


def leftovers(where: Path) -> list[str]:
    return sorted(n for n in os.listdir(where) if ".ncp-" in n)


async def test_a_killed_download_leaves_nothing_after_the_next_run(
        cluster: FakeCluster, env: dict[str, str], tmp_path: Path) -> None:
    container_dir(cluster)
    out = tmp_path / "out"
    out.mkdir()
    cluster.dir_stall_after = 1 << 20  # about half the tar, then nothing
    proc = await asyncio.create_subprocess_exec(
        KUBECTL, "ncp", "-c", "app", "web:/data/tree", str(out / "tree"), env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    left: list[str] = []
    for _ in range(400):  # until files arrived in its temp directory
        await asyncio.sleep(0.05)
        left = leftovers(out)
        if left and len(os.listdir(out / left[0])) > 5:
            break
    proc.send_signal(signal.SIGKILL)  # kubectl exec'd the plugin: this is the plugin
    await proc.wait()
    assert len(left) == 1 and leftovers(out) == left, leftovers(out)

    # A live run's directory stays (its lock is held).
    live = out / ".tree.ncp-live0001"
    live.mkdir()
    held = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        cluster.dir_stall_after = None
        r = await kubectl(env, "ncp", "-c", "app", "web:/data/tree", str(out / "tree"))
        assert r.rc == 0, r.err
    finally:
        os.close(held)
    assert leftovers(out) == [".tree.ncp-live0001"]
    assert {p.name: p.read_bytes() for p in (out / "tree").iterdir()} == FILES
