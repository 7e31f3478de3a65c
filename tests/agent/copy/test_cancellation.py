"""Issue 24 finding 9: a client leaving at any point of a copy leaks nothing.

The agent's handlers are cancelled when their client goes (handler_cancellation, as
aggapi.agent.main runs them) while a worker thread may be in the middle of a call.
Whatever that call opens or creates (an fd, an upload's temp file) must still be
released, no fd may be closed under a worker still using it, and the slot is freed.
A stale temp file the container's user may not remove does not stop the clean-up
of the others."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.agent.copy import cleanup
from aggapi.agent.copy import download as dl
from aggapi.agent.copy import upload as up
from aggapi.agent.copy.creds import Creds
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.workers import Workers
from tests.agent.copy.conftest import (
    POD_UID,
    CopyClient,
    DirResolver,
    build_app,
    temp_leftovers,
)

MiB = 1 << 20
HOLD = 0.15  # how long a slowed worker step holds its worker after doing its work


def fds_under(root: Path) -> list[str]:
    """This process's fds that point into ``root`` (the copy engine's, only)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target == str(root) or target.startswith(str(root) + "/"):
            out.append(target)
    return out


def _slowed(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, then a pause in the same worker: the client leaves meanwhile."""
    def slow(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        time.sleep(HOLD)
        return result
    return slow


class SlowAtomicFile(up.AtomicFile):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        time.sleep(HOLD)  # the temp file exists and its fd is open


@contextmanager
def slow_step(step: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        if step == "open":  # every in-root open: upload's parent dir, lookups
            mp.setattr(FsRoot, "open", _slowed(FsRoot.open))
        elif step == "atomic":
            mp.setattr(up, "AtomicFile", SlowAtomicFile)
        elif step == "lookup":
            mp.setattr(dl, "lookup", _slowed(dl.lookup))
        elif step == "open_regular":
            mp.setattr(dl, "open_regular", _slowed(dl.open_regular))
        elif step == "open_dir":
            mp.setattr(dl, "open_dir", _slowed(dl.open_dir))
        yield


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i in range(3):
            data = bytes([i]) * (300 * 1024)
            info = tarfile.TarInfo(f"d/f{i}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _body(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 64 * 1024):
        yield data[i:i + 64 * 1024]
        await asyncio.sleep(0.002)


async def _request(cc: CopyClient, op: str) -> None:
    if op == "upload":
        r = await cc.post("/up/new.bin", _body(os.urandom(2 * MiB)))
    elif op == "upload_tar":
        r = await cc.post("/up/tree", _body(_tar()), format="tar")
    elif op == "head":
        r = await cc.head("/big.bin")
    else:
        r = await cc.get("/big.bin" if op == "download" else "/tree")
    await r.read()


async def _scenario(root: Path, state_dir: str, op: str, step: str, leave_after: float
                    ) -> tuple[list[str], list[str], list[str], int]:
    limits = CopyLimits(size_limit=64 * MiB, state_dir=state_dir)
    app, state = build_app(DirResolver(root), limits)
    client: TestClient[Any, Any] = TestClient(TestServer(app, handler_cancellation=True))
    await client.start_server()
    try:
        cc = CopyClient(client, state)
        task = asyncio.create_task(_request(cc, op))
        await asyncio.sleep(leave_after)
        task.cancel()  # the client leaves: its connection closes
        try:
            await task
        except (asyncio.CancelledError, aiohttp.ClientError):
            pass
        # The server notices, cancels its handler, and waits out its workers.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and (  # noqa: ASYNC110 - the server's state
                state.slots.total or fds_under(root) or temp_leftovers(root)):
            await asyncio.sleep(0.02)
        return fds_under(root), temp_leftovers(root), os.listdir(state_dir), \
            state.slots.total
    finally:
        await client.close()
        state.workers.shutdown()


def _tree(base: Path) -> Path:
    root = base / "root"
    (root / "up").mkdir(parents=True)
    (root / "tree" / "sub").mkdir(parents=True)
    for i in range(20):
        (root / "tree" / "sub" / f"f{i}").write_bytes(os.urandom(64 * 1024))
    with open(root / "big.bin", "wb") as f:
        f.write(os.urandom(4 * MiB))
    return root


@settings(max_examples=30, deadline=None)
@given(op=st.sampled_from(["upload", "upload_tar", "download", "head", "dir"]),
       step=st.sampled_from(["none", "open", "atomic", "lookup", "open_regular",
                             "open_dir"]),
       leave_after=st.floats(0.0, 0.25))
def test_leaving_at_any_point_leaks_nothing(op: str, step: str, leave_after: float) -> None:
    with tempfile.TemporaryDirectory(prefix="aggapi-cancel-") as d:
        root = _tree(Path(d))
        state_dir = os.path.join(d, "state")
        os.makedirs(state_dir)
        with slow_step(step):
            fds, temps, records, slots = asyncio.run(
                _scenario(root, state_dir, op, step, leave_after))
        assert (fds, temps, records, slots) == ([], [], [], 0)


@pytest.mark.parametrize("step", ["open", "atomic"])
def test_leaving_while_the_upload_opens_leaks_no_fd_or_temp_file(step: str) -> None:
    """The two windows issue 24 names: the client goes while a worker opens the target
    directory or creates the AtomicFile (the call returns after the handler is gone).
    Several leaving times, as where the slowed step falls varies from run to run."""
    for leave_after in (0.01, 0.03, 0.06, 0.1, 0.14, 0.2):
        with tempfile.TemporaryDirectory(prefix="aggapi-cancel-") as d:
            root = _tree(Path(d))
            state_dir = os.path.join(d, "state")
            os.makedirs(state_dir)
            with slow_step(step):
                got = asyncio.run(_scenario(root, state_dir, "upload", step, leave_after))
            assert got == ([], [], [], 0), leave_after


USER = Creds(1000, 1000, (1000,))


class UserResolver(DirResolver):
    def open(self) -> FsRoot:
        return FsRoot(os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                      container_id="dir-container", pod_uid=POD_UID, container_name="c",
                      creds=USER)


def _stale_record(state_dir: str, root: FsRoot, dirs: list[tuple[str, Path]]) -> None:
    """A record and temp files as a killed agent leaves them."""
    rec = cleanup.InflightRecord(state_dir, root)
    for name, path in dirs:
        tmp = path / rec.temp_name(name)
        tmp.write_bytes(b"half")
        os.chown(tmp, USER.uid, USER.gid)
    assert rec._fd is not None
    os.close(rec._fd)  # the agent died: no done()
    rec._fd = None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as the agent")
def test_a_read_only_dir_does_not_stop_the_cleanup_pass() -> None:
    d = Path(tempfile.mkdtemp(prefix="aggapi-cleanup-", dir="/tmp"))
    try:
        d.chmod(0o755)
        root_dir = d / "root"
        state_dir = str(d / "state")
        os.makedirs(state_dir)
        for name in ("ro", "rw", "rw2"):
            (root_dir / name).mkdir(parents=True)
            os.chown(root_dir / name, USER.uid, USER.gid)
        root_dir.chmod(0o755)
        resolver = UserResolver(root_dir)
        root = resolver.open()
        try:
            _stale_record(state_dir, root, [("/ro", root_dir / "ro"),
                                            ("/rw", root_dir / "rw")])
            _stale_record(state_dir, root, [("/rw2", root_dir / "rw2")])
        finally:
            root.close()
        (root_dir / "ro").chmod(0o555)  # the container: its user may not unlink there
        workers = Workers(2)
        try:
            done = asyncio.run(cleanup.cleanup_stale(state_dir, resolver.by_id, workers))
        finally:
            workers.shutdown()
        assert done.removed == 2 and done.pending == set()
        assert [Path(p).parent.name for p in temp_leftovers(root_dir)] == ["ro"]
        assert os.listdir(state_dir) == []
    finally:
        (d / "root" / "ro").chmod(0o755)
        shutil.rmtree(d)
