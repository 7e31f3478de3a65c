"""The escape corpus of test_escape_corpus.py (its case data, imported) against a real
runc container, and a read-only bind mount.

One long-lived pod, run through CRI the way kubelet runs it (kubelet's labels, see
tests.framework.pods) from the busybox image the session builds and pushes to the test
registry; every copy goes through the agent's real HTTPS API with a capability token. Our
CRI client has no exec, so hostile layouts are made on the host side of a bind mount (a
host temp dir at /data in the container) and, for the container's own rootfs, through
/proc/<pid>/root: the tree under /data, plus each /proc/self case re-aimed at the
container's pid 1."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.agentserver import Agent, pki, run_agent
from tests.agent.copy.conftest import snapshot, temp_leftovers
from tests.agent.copy.runcsupport import POD, container_pid
from tests.agent.copy.test_escape_corpus import CORPUS, VICTIM, Case, build_tree
from tests.framework.containerd import Containerd
from tests.framework.pods import ContainerSpec, PodRunner, RunningPod
from tests.tarcraft import pax_tar

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
