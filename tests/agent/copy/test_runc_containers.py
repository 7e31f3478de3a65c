"""The copy engine's escape and failure proofs against real runc containers.

Pods are run through CRI the way kubelet runs them (kubelet's labels, see
tests.framework.pods) from the busybox image the session builds and pushes to
the test registry; every copy goes through the agent's real HTTPS API with a
capability token. Our CRI client has no exec, so hostile layouts are made on
the host side of a bind mount (a host temp dir at /data in the container) and,
for the container's own rootfs, through /proc/<pid>/root; the swapping race is
the container's own command.

- the escape corpus of test_escape_corpus.py (its case data, imported) with the
  tree under /data, plus each /proc/self case re-aimed at the container's pid 1;
- a busybox loop inside the container swapping /data/d for symlinks to / and to a
  host directory while hundreds of copies run;
- the agent (a real ``python3 -m aggapi agent`` process) SIGKILLed mid-upload,
  and its start-up cleanup on restart, also after the pod's container was replaced;
- the container stopped through CRI mid-download and mid-upload;
- a read-only bind mount.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.auth.capability import CapabilitySigner
from aggapi.runtime.cri import CRIClient
from tests.agent.agentserver import NODE, Agent, client_ssl, pki, run_agent
from tests.agent.copy.conftest import HeldBody, snapshot, temp_leftovers
from tests.agent.copy.test_escape_corpus import CORPUS, VICTIM, Case, build_tree
from tests.framework.containerd import Containerd
from tests.framework.pods import ContainerSpec, PodRunner, RunningPod
from tests.framework.repo import REPO
from tests.tarcraft import pax_tar

POD = "p"  # the pod name Agent.token puts in its capabilities
BB = "/bin/busybox"
ESCAPE_NAMES = ("x", "new", "harmless", "short", "h", "l", "null", "sda", "p", "big", "f",
                "devnull_x", "sub", "pwned")


def host_names(*dirs: str) -> set[str]:
    """Which of the names the corpus writes exist in these host directories."""
    return {os.path.join(d, n) for d in dirs for n in ESCAPE_NAMES
            if os.path.lexists(os.path.join(d, n))}


def rootfs_snapshot(rootfs: Path) -> dict[str, bytes | str]:
    """The container's own rootfs, without its kernel and bind mounts."""
    out: dict[str, bytes | str] = {}
    for entry in sorted(os.listdir(rootfs)):
        if entry in ("proc", "sys", "dev", "data", "ro"):
            continue
        p = rootfs / entry
        if not p.is_symlink() and p.is_dir():
            out.update(snapshot(p))
        out[str(p)] = ("link:" + os.readlink(p) if p.is_symlink()
                       else p.read_bytes() if p.is_file() else "other")
    return out


def clear(d: Path) -> None:
    for child in d.iterdir():
        if not child.is_symlink() and child.is_dir():
            shutil.rmtree(child)
        else:
            child.unlink()


async def container_pid(cri: CRIClient, cid: str) -> int:
    st = await cri.container_status(cid, verbose=True)
    assert st is not None and st.pid, st
    return st.pid


async def wait_for(cond: Any, timeout: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what or cond}")
        await asyncio.sleep(0.02)



# --- one long-lived pod for the corpus and the read-only checks -----------------------------

@dataclass
class CorpusPod:
    agent: Agent
    session: aiohttp.ClientSession
    pod: RunningPod
    image: str
    data: Path  # host side of /data (rw)
    ro: Path  # host side of /ro (read-only in the container)
    outside: Path  # a host directory the container must never reach
    state: Path  # the agent's --copy-state-dir
    rootfs: Path  # /proc/<pid>/root of container c0

    async def send(self, method: str, path: str, data: Any = None,
                   params: dict[str, str] | None = None) -> tuple[int, bytes]:
        async with self.agent.copy(method, path, uid=self.pod.uid, images=[self.image],
                                   data=data, params=params, session=self.session) as r:
            return r.status, await r.read()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def corpus_pod(containerd: Containerd, busybox_image: str,
                     tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[CorpusPod]:
    base = tmp_path_factory.mktemp("runc-corpus")
    dirs = {n: base / n for n in ("data", "ro", "outside", "state")}
    for d in dirs.values():
        d.mkdir()
    async with containerd.cri_client() as cri:
        runner = PodRunner(cri, cgroup_parent=containerd.cgroup_parent,
                           log_root=containerd.workdir / "pods")
        try:
            pod = await runner.run_pod(POD, [ContainerSpec(
                "c0", busybox_image, mounts=[(str(dirs["data"]), "/data", False),
                                             (str(dirs["ro"]), "/ro", True)])])
            pid = await container_pid(cri, pod.containers["c0"])
            limits = CopyLimits(size_limit=1 << 20, copies_per_pod=8,
                                state_dir=str(dirs["state"]))
            async with run_agent(pki(base / "pki"), cri=cri, containerd=None,
                                 copy=limits) as agent, agent.session() as session:
                yield CorpusPod(agent, session, pod, busybox_image, dirs["data"], dirs["ro"],
                                dirs["outside"], dirs["state"], Path(f"/proc/{pid}/root"))
        finally:
            await runner.remove_all()


def container_path(path: str) -> str:
    """A corpus path for a tree built at /data: absolute paths move under /data, except
    the container's own /proc and the '//' spelling (refused by syntax either way)."""
    if path.startswith("/") and not path.startswith(("//", "/proc/")):
        return "/data" + path
    return path


def pid1(path: str) -> str:
    return (path.replace("/proc/self/", "/proc/1/")
            .replace("/proc/thread-self/", "/proc/1/task/1/")
            .replace("/proc_link/", "/proc1_link/"))


def in_container_cases() -> Iterator[Any]:
    """(case, container path, strict). The agent is not in the container's pid namespace,
    so /proc/self there is a dangling link (404) that never reaches a magic link: those
    cases also accept 404, and each comes again aimed at the container's pid 1, whose
    root/cwd/fd links are real magic links (strict: the corpus's expected codes only)."""
    for case in CORPUS:
        if case.method != "GET" and 200 in case.expect:
            continue  # a relative upload that legitimately writes: test_relative_paths_*
        yield pytest.param(case, container_path(case.path), not case.needs_proc, id=case.id)
    for case in CORPUS:
        if case.needs_proc and pid1(case.path) != case.path:
            yield pytest.param(case, container_path(pid1(case.path)), True,
                               id=case.id + "-pid1")


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("case", "path", "strict"), list(in_container_cases()))
async def test_escape_corpus_in_runc_container(corpus_pod: CorpusPod, case: Case, path: str,
                                               strict: bool) -> None:
    cp = corpus_pod
    for d in (cp.data, cp.outside):
        clear(d)
    build_tree(cp.data, cp.outside, at="/data")
    os.symlink("/proc/1/root" + str(cp.outside), cp.data / "proc1_link")
    before = snapshot(cp.outside), snapshot(cp.data), rootfs_snapshot(cp.rootfs)
    host_before = host_names("/", "/tmp", "/etc", str(cp.outside.parent))

    method = "POST" if case.method == "TAR" else case.method
    body = case.body(cp.outside) if case.body else b"pwned" if method == "POST" else None
    status, got = await cp.send(method, path, body,
                                {"format": "tar"} if case.method == "TAR" else None)

    allowed = set(case.expect) | (set() if strict else {404})  # see in_container_cases
    assert status in allowed, f"{case.id} {path!r}: {status} {got[:300]!r}"
    assert VICTIM not in got
    assert snapshot(cp.outside) == before[0]
    assert (cp.outside / "victim").read_bytes() == VICTIM
    assert snapshot(cp.data) == before[1], "a refused copy changed /data"
    assert rootfs_snapshot(cp.rootfs) == before[2], "a refused copy changed the rootfs"
    assert host_names("/", "/tmp", "/etc", str(cp.outside.parent)) == host_before
    assert temp_leftovers(cp.data) == [] and temp_leftovers(cp.rootfs / "tmp") == []
    assert os.listdir(cp.state) == []
    # Control: the refusal came from this container's tree, which the agent does reach.
    assert (await cp.send("HEAD", "/data/up"))[0] == 200


@pytest.mark.asyncio(loop_scope="module")
async def test_read_only_bind_mount(corpus_pod: CorpusPod) -> None:
    cp = corpus_pod
    clear(cp.ro)
    (cp.ro / "existing").write_bytes(b"read-only content")
    (cp.ro / "dir").mkdir()
    before = snapshot(cp.ro)
    for path, data, params, what in [
        ("/ro/new", b"x", None, "new file"),
        ("/ro/existing", b"replaced", None, "existing file"),
        ("/ro/dir/new", b"x", None, "file in a subdirectory"),
        ("/ro/dir", pax_tar({"a": b"a", "b/c": b"c"}), {"format": "tar"}, "tar into a dir"),
        ("/ro/newdir", pax_tar({"a": b"a"}), {"format": "tar"}, "tar creating its dir"),
    ]:
        status, body = await cp.send("POST", path, data, params)
        assert status == 409, f"{what}: {status} {body!r}"
        assert b"read-only file system" in body, body
    assert snapshot(cp.ro) == before
    assert os.listdir(cp.state) == []
    # The same container takes a write where its mount is writable.
    clear(cp.data)
    status, body = await cp.send("POST", "/data/ok", b"fine")
    assert status == 200, body
    assert (cp.data / "ok").read_bytes() == b"fine"


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

@pytest.fixture
def agent_dirs(tmp_path: Path) -> dict[str, Path]:
    dirs = {n: tmp_path / n for n in ("data", "outside", "state")}
    for d in dirs.values():
        d.mkdir()
    return dirs


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
