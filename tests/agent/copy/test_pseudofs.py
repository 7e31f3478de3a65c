"""Downloads never read past the size fstat gave, refuse kernel pseudo file systems
(finding 4), and never report a /proc magic link's target (finding 9).

A plain-directory "container" rooted at the host's / reaches the host's procfs
and sysfs; a busybox box with its own procfs mounted covers a pseudo file
system met inside a directory walk."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy import pseudofs
from aggapi.agent.copy.digests import DigestCache
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import Box, DirResolver, PidResolver


def stat_of(resp: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(base64.b64decode(resp.headers["X-Aggapi-Stat"]))
    return doc


@pytest.fixture
async def host(serve: Any, limits: CopyLimits) -> Any:
    return await serve(DirResolver(Path("/")), limits)


def test_fs_type_names_procfs_sysfs_and_not_tmp(tmp_path: Path) -> None:
    for path, want in (("/proc/self/status", "procfs"), ("/sys/kernel", "sysfs")):
        fd = os.open(path, os.O_PATH)
        try:
            assert pseudofs.pseudo_fs(fd) == want
        finally:
            os.close(fd)
    fd = os.open(tmp_path, os.O_PATH)
    try:
        assert pseudofs.pseudo_fs(fd) is None
    finally:
        os.close(fd)


def test_digest_reads_no_further_than_fstat_size() -> None:
    # procfs reports size 0 for a file with content: nothing past 0 may be read.
    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        assert os.fstat(fd).st_size == 0 and os.pread(fd, 10, 0)
        assert DigestCache().digest(fd, os.fstat(fd).st_size) == hashlib.sha256(b"").hexdigest()
    finally:
        os.close(fd)


@pytest.mark.parametrize("path", [p for p in ("/proc/self/status", "/proc/self/pagemap",
                                               "/sys/kernel/mm/transparent_hugepage/enabled",
                                               "/sys/devices/system/cpu/online")
                                  if os.path.exists(p)])
async def test_pseudo_files_are_refused_with_400(host: Any, path: str) -> None:
    r = await host.get(path)
    assert r.status == 400, await r.text()
    body = await r.json()
    assert body["kind"] == "Status" and "pseudo file system" in body["message"]
    # HEAD answers what GET answers (issue 35), with no content digest.
    head = await host.head(path)
    assert head.status == 400
    assert "X-Aggapi-Sha256" not in head.headers


@pytest.mark.parametrize("path", ["/proc/1", "/sys/kernel"])
async def test_pseudo_directories_are_refused_with_400(host: Any, path: str) -> None:
    r = await host.get(path)
    assert r.status == 400, await r.text()
    assert "pseudo file system" in (await r.json())["message"]


async def test_magic_links_have_no_target(host: Any) -> None:
    for path in ("/proc/self/exe", "/proc/self/cwd", "/proc/self/root"):
        r = await host.head(path, query={"symlink": "keep"})
        assert r.status == 200, await r.text()
        st = stat_of(r)
        assert st["type"] == "symlink" and st["linkTarget"] == "", (path, st)
        r = await host.get(path, query={"symlink": "keep"})
        assert stat_of(r)["linkTarget"] == "" and await r.read() == b""
        r = await host.get(path)  # not asked for the link: 409, naming no target either
        assert r.status == 409 and " to '" not in (await r.json())["message"]
    # An ordinary procfs symlink keeps its target.
    st = stat_of(await host.head("/proc/self", query={"symlink": "keep"}))
    assert st["type"] == "symlink" and st["linkTarget"] == str(os.getpid())


async def test_walk_skips_a_mounted_pseudo_file_system(box: Box, serve: Any,
                                                       limits: CopyLimits) -> None:
    # A sysfs-backed file bind-mounted into the tree, beside the box's own /proc mount.
    (box.rootfs / "data" / "cpus").write_bytes(b"")
    (box.rootfs / "data" / "plain").write_bytes(b"plain file")
    mount = await asyncio.create_subprocess_exec(
        "nsenter", "-t", str(box.pid), "-m", "--", "mount", "--bind",
        "/sys/devices/system/cpu/online", str(box.rootfs / "data" / "cpus"))
    assert await mount.wait() == 0
    cc = await serve(PidResolver(box.pid), limits)
    r = await cc.get("/", query={"digest": "entry"})  # with the skipped report
    assert r.status == 200, await r.text()
    with tarfile.open(fileobj=io.BytesIO(await r.read()), mode="r:") as tf:
        members = tf.getmembers()
    names = {m.name for m in members}
    assert "data/plain" in names and "bin/busybox" in names
    assert not any(n.startswith("proc/") for n in names) and "data/cpus" not in names
    skipped = {s["path"]: s["reason"] for s in json.loads(members[-1].pax_headers[
        "AGGAPI.skipped"])}
    assert "pseudo file system" in skipped["proc"] and "pseudo file system" in skipped[
        "data/cpus"]
