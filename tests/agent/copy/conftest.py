"""Fixtures for the copy engine: a plain-directory "container", a real process in
its own mount namespace chrooted into a busybox rootfs, and an HTTP server
running the real handlers with a capability injected per request."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer

from aggapi.agent.auth import CAPABILITY
from aggapi.agent.copy.cleanup import InflightRecord
from aggapi.agent.copy.container import open_process_root
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.handlers import CopyHandlers
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.state import CopyState
from aggapi.agent.copy.tarextract import TarExtractor
from aggapi.agent.copy.targetdir import open_target_dir, remove_created_target
from aggapi.agent.copy.untar import TarSink
from aggapi.agent.copy.uploadparams import UploadParams
from aggapi.agent.copy.workers import Workers
from aggapi.auth.capability import Capability, ContainerRef
from aggapi.status import StatusError, status_middleware

BUSYBOX = "/bin/busybox"
APPLETS = ("sh", "mv", "ln", "rm", "sleep", "cat", "mkdir", "ls", "echo", "true")
POD_UID = "pod-uid-1"


def make_capability(operation: str, path: str | None, params: dict[str, str],
                    namespace: str = "", pod_uid: str = POD_UID) -> Capability:
    """What the auth middleware would have verified: pod POD_UID (in no namespace unless
    given), one container "c"."""
    return Capability(issuer="test", node="node-a", subject="alice", jti="test",
                      issued_at=0, expires_at=0, operation=operation, pod_uid=pod_uid,
                      pod_namespace=namespace, containers=(ContainerRef("c", "busybox"),),
                      path=path, params=params)


class DirResolver:
    """A plain directory as the container root (no pid, identity id maps)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def open(self) -> FsRoot:
        return FsRoot(os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                      container_id="dir-container", pod_uid=POD_UID, container_name="c")

    async def resolve(self, pod_uid: str, container: str) -> FsRoot:
        return self.open()

    async def by_id(self, container_id: str) -> FsRoot | None:
        return self.open() if container_id == "dir-container" else None


class PidResolver:
    """A live process: the same open_process_root the CRI resolver uses."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    async def resolve(self, pod_uid: str, container: str) -> FsRoot:
        return open_process_root(self.pid, container_id="pid-container", pod_uid=pod_uid,
                                 container_name=container)

    async def by_id(self, container_id: str) -> FsRoot | None:
        if container_id != "pid-container":
            return None
        try:
            return open_process_root(self.pid, container_id=container_id)
        except StatusError:
            return None


@dataclass
class Box:
    rootfs: Path
    pid: int
    proc: subprocess.Popen[bytes]
    helpers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run_inside(self, script: str) -> subprocess.Popen[bytes]:
        """Start a shell inside the box (its mount namespace and chroot)."""
        p = subprocess.Popen(["nsenter", "-t", str(self.pid), "-m", "--", "chroot",
                              str(self.rootfs), "/bin/sh", "-c", script],
                             env={"PATH": "/bin"}, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        self.helpers.append(p)
        return p

    def kill(self) -> None:
        for p in self.helpers:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)


def make_rootfs(rootfs: Path) -> None:
    for d in ("bin", "proc", "tmp", "data", "etc"):
        (rootfs / d).mkdir(parents=True, exist_ok=True)
    shutil.copy2(BUSYBOX, rootfs / "bin" / "busybox")
    for a in APPLETS:
        os.symlink("busybox", rootfs / "bin" / a)
    (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/:/bin/sh\n")


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Box]:
    """A process in its own mount namespace (proc mounted) chrooted into a busybox rootfs."""
    if not os.path.exists(BUSYBOX) or shutil.which("unshare") is None:
        pytest.skip("needs busybox-static and unshare")
    rootfs = tmp_path / "rootfs"
    make_rootfs(rootfs)
    script = (f"mount -t proc proc {rootfs}/proc && exec chroot {rootfs} /bin/sh -c "
              "'echo $$ > /tmp/pid.tmp && mv /tmp/pid.tmp /tmp/pid && exec sleep 600'")
    proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "--fork", "sh", "-c",
                             script], env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    pidfile = rootfs / "tmp" / "pid"
    deadline = time.monotonic() + 10
    while not pidfile.exists():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            proc.wait()
            pytest.fail("box did not start")
        time.sleep(0.02)
    b = Box(rootfs, int(pidfile.read_text()), proc)
    try:
        yield b
    finally:
        b.kill()


class CopyClient:
    """Calls the real handlers over HTTP with a capability for each request."""

    def __init__(self, client: TestClient[Any, Any], state: CopyState) -> None:
        self.client = client
        self.state = state

    def _headers(self, op: str, path: str | None, params: dict[str, str],
                 extra: dict[str, str] | None, namespace: str = "",
                 pod_uid: str = POD_UID) -> dict[str, str]:
        cap = {"operation": op, "path": path, "params": params, "namespace": namespace,
               "pod_uid": pod_uid}
        return {"X-Test-Cap": json.dumps(cap), **(extra or {})}

    async def head(self, path: str, headers: dict[str, str] | None = None,
                   query: dict[str, str] | None = None, namespace: str = "",
                   pod_uid: str = POD_UID, **kw: Any) -> ClientResponse:
        return await self.client.head(
            "/v1/copy", params={"container": "c", "path": path, **(query or {})},
            headers=self._headers("copy.stat", path, {}, headers, namespace, pod_uid), **kw)

    async def get(self, path: str, headers: dict[str, str] | None = None,
                  query: dict[str, str] | None = None, **kw: Any) -> ClientResponse:
        return await self.client.get("/v1/copy",
                                     params={"container": "c", "path": path, **(query or {})},
                                     headers=self._headers("copy.download", path, {}, headers),
                                     **kw)

    async def post(self, path: str, data: Any, *, query_extra: dict[str, str] | None = None,
                   cap_path: str | None = None, **params: str) -> ClientResponse:
        query = {"container": "c", "path": path, **params, **(query_extra or {})}
        return await self.client.post(
            "/v1/copy", params=query, data=data,
            headers=self._headers("copy.upload", cap_path if cap_path is not None else path,
                                  params, None))


@web.middleware
async def fake_capability(request: web.Request, handler: Any) -> web.StreamResponse:
    raw = request.headers.get("X-Test-Cap")
    if raw:
        d = json.loads(raw)
        request[CAPABILITY] = make_capability(d["operation"], d["path"], d["params"],
                                              d.get("namespace", ""),
                                              d.get("pod_uid", POD_UID))
    resp: web.StreamResponse = await handler(request)
    return resp


def build_app(resolver: Any, limits: CopyLimits) -> tuple[web.Application, CopyState]:
    app = web.Application(middlewares=[status_middleware, fake_capability],
                          client_max_size=1 << 40)
    state = CopyState(limits, resolver, workers=Workers(4))
    api = CopyHandlers(state)
    app.router.add_route("HEAD", "/v1/copy", api.stat)
    app.router.add_get("/v1/copy", api.download, allow_head=False)
    app.router.add_post("/v1/copy", api.upload)
    return app, state


@pytest.fixture
def limits(tmp_path: Path) -> CopyLimits:
    return CopyLimits(size_limit=64 << 20, copies_per_pod=4, copies_per_node=8,
                      max_entries=1000, max_depth=16, state_dir=str(tmp_path / "state"))


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    """serve(resolver, limits, **server_kw) -> CopyClient; servers are closed at
    teardown."""
    opened: list[tuple[TestClient[Any, Any], CopyState]] = []

    async def start(resolver: Any, limits: CopyLimits, **server_kw: Any) -> CopyClient:
        """``server_kw`` go to the AppRunner (handler_cancellation=True: as the agent's)."""
        os.makedirs(limits.state_dir, exist_ok=True)
        app, state = build_app(resolver, limits)
        client: TestClient[Any, Any] = TestClient(TestServer(app, **server_kw))
        await client.start_server()
        opened.append((client, state))
        return CopyClient(client, state)

    yield start
    for client, state in opened:
        await client.close()
        state.workers.shutdown()
        state.hashers.shutdown()


@pytest.fixture
def plain(tmp_path: Path) -> tuple[Path, Path]:
    """(container root, a host directory outside it)."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    return root, outside


@pytest.fixture
async def cc(plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> Any:
    """A copy client of an agent serving ``plain``'s container with ``limits`` (a module
    that wants other limits defines its own ``cc``)."""
    return await serve(DirResolver(plain[0]), limits)


# The host directories of the runc-container tests (test_runc_paths.py,
# test_runc_failures.py): data (the container's /data), outside, the agent's state.
@pytest.fixture
def agent_dirs(tmp_path: Path) -> dict[str, Path]:
    dirs = {n: tmp_path / n for n in ("data", "outside", "state")}
    for d in dirs.values():
        d.mkdir()
    return dirs


@dataclass
class HeldBody:
    """An upload body that sends ``first`` MiB, sets ``sent``, then waits for ``release``
    (never set: the rest never comes) before ``rest`` MiB more, so that a test can act
    while the agent holds the upload's temp file."""

    first: int = 1
    rest: int = 4
    sent: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def chunks(self) -> AsyncIterator[bytes]:
        for _ in range(self.first):
            yield b"a" * (1 << 20)
        self.sent.set()
        await self.release.wait()
        for _ in range(self.rest):
            yield b"b" * (1 << 20)


def temp_leftovers(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            if n.startswith(".aggapi-tmp-"):
                found.append(os.path.join(dirpath, n))
    return found


def snapshot(path: Path) -> dict[str, bytes | str]:
    """Everything under ``path`` (names, link targets, file contents)."""
    out: dict[str, bytes | str] = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                out[p] = "link:" + os.readlink(p)
            elif os.path.isfile(p):
                out[p] = Path(p).read_bytes()
            else:
                out[p] = "dir"
    return out


def extract_tar(root_dir: Path, raw: bytes, limits: CopyLimits, *, chunk: int = 1 << 20,
                headers_digest: str | None = None, fast: bool = True,
                pieces: int = 1, params: UploadParams | None = None) -> TarSink:
    """Extract ``raw`` into ``root_dir``/dst (built privately and published if missing)
    as upload_tar does, fed ``chunk`` bytes at a time (each in ``pieces`` received
    pieces), in this thread; raises its refusal, else returns the sink. With
    ``headers_digest``, as under sha256=headers:<it>: the stream's headers digest is
    compared before the commit. ``fast=False``: the Python path alone (fastuntar)."""
    root = FsRoot(os.open(root_dir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                  container_id="extract")
    record = InflightRecord(limits.state_dir, root)
    target_fd, made = open_target_dir(root, "/dst", record)
    ex = TarExtractor(root, record, target_fd, "/dst", params or UploadParams(), fresh=made)
    sink = TarSink(ex, root, limits, headers_only=headers_digest is not None, fast=fast)
    ok = False
    try:
        for i in range(0, len(raw), chunk):
            part = raw[i:i + chunk]
            step = max(1, -(-len(part) // pieces))
            sink.feed_many([part[j:j + step] for j in range(0, len(part), step)])
        sink.finish()
        if headers_digest is not None and sink.hash.hexdigest() != headers_digest:
            raise StatusError(400, "sha256 mismatch")
        ex.commit()
        ok = True
    finally:
        sink.abort()
        if not ok:
            ex.rollback()
            remove_created_target(root, "/dst", made)
        ex.close()
        os.close(target_fd)
        record.done()
        os.close(root.root_fd)
    return sink
