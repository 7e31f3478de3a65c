"""Copies into a real process's root: a symlink-swapping race, a container that
exits mid-copy, and temp files left by a killed agent."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import tarfile
from pathlib import Path
from typing import Any

from aggapi.agent.copy import cleanup, engine
from aggapi.agent.copy.container import open_process_root
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.state import CopyState
from aggapi.agent.copy.workers import Workers
from tests.agent.copy.conftest import (
    Box,
    HeldBody,
    PidResolver,
    snapshot,
    temp_leftovers,
)


async def test_symlink_swap_race_never_escapes(box: Box, serve: Any, limits: CopyLimits,
                                               tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "d" / "secret").write_bytes(b"HOST SECRET")
    before = snapshot(outside)
    data = box.rootfs / "data"
    (data / "d").mkdir()
    (data / "d" / "secret").write_bytes(b"container file")
    depth = len(data.parts) + 2
    # Inside the box: keep swapping the directory d for symlinks that would
    # lead to the host directory if they were resolved in the host's view.
    swapper = box.run_inside(
        f"cd /data; while true; do mv d d.real; ln -s {outside} d; rm d; "
        f"ln -s {'../' * depth}{str(outside).lstrip('/')} d; rm d; mv d.real d; done")
    cc = await serve(PidResolver(box.pid), CopyLimits(copies_per_pod=64, copies_per_node=64,
                                                      state_dir=limits.state_dir))
    statuses: dict[int, int] = {}

    async def one(i: int) -> None:
        if i % 3 == 0:
            r = await cc.post(f"/data/d/up{i}", b"pwned %d" % i)
        elif i % 3 == 1:
            r = await cc.get("/data/d/secret")
            body = await r.read()
            assert b"HOST SECRET" not in body
        else:
            r = await cc.get("/data/d")
            body = await r.read()
            assert b"HOST SECRET" not in body
        statuses[r.status] = statuses.get(r.status, 0) + 1

    for batch in range(20):
        await asyncio.gather(*(one(batch * 16 + i) for i in range(16)))
    os.kill(swapper.pid, signal.SIGKILL)
    swapper.wait(10)
    assert snapshot(outside) == before  # 0 escapes
    assert set(statuses) <= {200, 404, 409}, statuses
    assert statuses.get(200, 0) > 0  # the race was run, not just refused
    assert temp_leftovers(box.rootfs) == []


async def test_container_exits_mid_upload(box: Box, serve: Any, limits: CopyLimits) -> None:
    (box.rootfs / "data" / "t").write_bytes(b"before")
    cc = await serve(PidResolver(box.pid), limits)
    body = HeldBody()
    task = asyncio.create_task(cc.post("/data/t", body.chunks()))
    await body.sent.wait()
    await asyncio.sleep(0.1)
    box.kill()
    body.release.set()
    r = await task
    assert r.status == 409
    assert "exited" in (await r.json())["message"]
    assert (box.rootfs / "data" / "t").read_bytes() == b"before"
    assert temp_leftovers(box.rootfs) == []


async def test_container_exits_mid_download(box: Box, serve: Any, limits: CopyLimits) -> None:
    big = os.urandom(8 << 20)
    (box.rootfs / "data" / "big").write_bytes(big)
    cc = await serve(PidResolver(box.pid), limits)
    r = await cc.get("/data/big")
    assert r.status == 200
    got = await r.content.read(1 << 20)
    box.kill()
    try:
        got += await r.read()
    except Exception:  # the agent cut the connection: that is the point
        pass
    assert len(got) < len(big)


async def test_tar_upload_into_process_root(box: Box, serve: Any, limits: CopyLimits) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("sub/hello")
        info.size = 5
        tf.addfile(info, io.BytesIO(b"hello"))
    cc = await serve(PidResolver(box.pid), limits)
    r = await cc.post("/data/new", buf.getvalue(), format="tar")
    assert r.status == 200, await r.text()
    assert (box.rootfs / "data" / "new" / "sub" / "hello").read_bytes() == b"hello"


def _upload_in_flight(box: Box, limits: CopyLimits, data: bytes | None = None
                      ) -> tuple[FsRoot, cleanup.InflightRecord, str]:
    """An upload into /data as a live agent holds it: its record (flock held) and, with
    ``data``, its temp file."""
    os.makedirs(limits.state_dir, exist_ok=True)
    root = open_process_root(box.pid, container_id="pid-container")
    rec = cleanup.InflightRecord(limits.state_dir, root)
    tmp = rec.temp_name("/data")
    if data is not None:
        (box.rootfs / "data" / tmp).write_bytes(data)
    return root, rec, tmp


def _agent_dies(rec: cleanup.InflightRecord) -> None:
    """The record's writer dies: its fd (and flock) go, the record file stays."""
    assert rec._fd is not None
    os.close(rec._fd)
    rec._fd = None


async def test_startup_cleanup_removes_stale_temp_files(box: Box, limits: CopyLimits) -> None:
    """An agent killed mid-upload leaves a temp file and its record; the next start removes
    exactly that file (found by container id and directory, not by pid)."""
    root, rec, _ = _upload_in_flight(box, limits, b"half an upload")
    (box.rootfs / "data" / ".aggapi-tmp-someoneelse-1").write_bytes(b"not ours")
    (box.rootfs / "data" / "keep").write_bytes(b"keep")
    _agent_dies(rec)  # the record's fd is never closed cleanly
    root.close()
    workers = Workers(2)
    try:
        done = await cleanup.cleanup_stale(limits.state_dir, PidResolver(box.pid).by_id,
                                           workers)
    finally:
        workers.shutdown()
    assert (done.removed, done.pending) == (1, set())
    assert sorted(os.listdir(box.rootfs / "data")) == [".aggapi-tmp-someoneelse-1", "keep"]
    assert os.listdir(limits.state_dir) == []


async def test_startup_cleanup_leaves_a_live_agents_uploads_alone(box: Box,
                                                                 limits: CopyLimits) -> None:
    """A DaemonSet rolling with maxSurge starts the new agent while the old one still
    uploads: the new agent's cleanup must not remove that upload's temp file or record."""
    root, rec, tmp = _upload_in_flight(box, limits, b"an upload in flight")
    workers = Workers(2)
    try:
        done = await cleanup.cleanup_stale(limits.state_dir, PidResolver(box.pid).by_id,
                                           workers)
        assert (done.removed, done.pending) == (0, {rec.path})
        assert tmp in os.listdir(box.rootfs / "data")
        assert os.listdir(limits.state_dir) == [os.path.basename(rec.path)]
        # The old agent dies mid-upload: the next start cleans up after it.
        _agent_dies(rec)
        done = await cleanup.cleanup_stale(limits.state_dir, PidResolver(box.pid).by_id,
                                           workers, only=done.pending)
    finally:
        workers.shutdown()
        root.close()
    assert (done.removed, done.pending) == (1, set())
    assert tmp not in os.listdir(box.rootfs / "data")
    assert os.listdir(limits.state_dir) == []


async def test_startup_comes_back_once_the_old_agent_dies(box: Box, limits: CopyLimits,
                                                          monkeypatch: Any) -> None:
    """The new agent starts while the old one still uploads (the upload's record is
    locked); the old agent dies a moment later. The new agent's engine comes back for
    the record without another restart: the temp file goes, nothing else does."""
    monkeypatch.setattr(engine, "RETRY_FIRST", 0.05)
    root, rec, tmp = _upload_in_flight(box, limits, b"an upload in flight")
    (box.rootfs / "data" / "keep").write_bytes(b"keep")
    state = CopyState(limits, PidResolver(box.pid))
    try:
        await engine.startup(state)
        assert state.cleanup_task is not None and not state.cleanup_task.done()
        await asyncio.sleep(0.3)
        assert tmp in os.listdir(box.rootfs / "data")  # still the old agent's
        _agent_dies(rec)
        await asyncio.wait_for(state.cleanup_task, 10)
    finally:
        engine.shutdown(state)
        root.close()
    assert os.listdir(box.rootfs / "data") == ["keep"]
    assert os.listdir(limits.state_dir) == []


async def test_shutdown_stops_the_cleanup_retries(box: Box, limits: CopyLimits) -> None:
    root, rec, _ = _upload_in_flight(box, limits)
    state = CopyState(limits, PidResolver(box.pid))
    try:
        await engine.startup(state)
        task = state.cleanup_task
        assert task is not None
    finally:
        engine.shutdown(state)
        rec.done()
        root.close()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
