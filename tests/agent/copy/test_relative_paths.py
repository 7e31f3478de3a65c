"""Relative copy paths (``kubectl cp pod:dir/file``) start at the container process's
working directory as the container sees it, and stay inside the container root.

The process is the chrooted busybox box in its own mount namespace (as a runc
container is), started with its cwd in /data; the copies go through the agent's
real handlers with a capability naming the relative path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.agent.copy.fsroot import in_root
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import Box, PidResolver


@pytest.mark.parametrize(("link", "root", "want"), [
    ("/data", "/", "/data"),                      # another mount namespace: its own view
    ("/srv/rootfs/data", "/srv/rootfs", "/data"),  # a chroot seen from the host
    ("/srv/rootfs", "/srv/rootfs", "/"),
    ("/srv/rootfs2/data", "/srv/rootfs", None),    # a sibling, not below the root
    ("/etc", "/srv/rootfs", None),
    ("/data (deleted)", "/", None),
    ("(unreachable)/data", "/", "/data"),
    ("relative", "/", None),
])
def test_cwd_below_the_root(link: str, root: str, want: str | None) -> None:
    assert in_root(link, root) == want


@settings(max_examples=200, deadline=None)
@given(root=st.lists(st.sampled_from(["a", "b", "rootfs"]), min_size=1, max_size=3),
       rest=st.lists(st.sampled_from(["a", "b", "..x", "c d"]), max_size=4))
def test_cwd_inside_root_round_trips(root: list[str], rest: list[str]) -> None:
    r = "/" + "/".join(root)
    got = in_root(r + "".join("/" + x for x in rest), r)
    assert got == "/" + "/".join(rest)


def start_in_box(box: Box, script: str) -> subprocess.Popen[bytes]:
    """A shell in the box's mount namespace and chroot (killed with the box)."""
    p = subprocess.Popen(["nsenter", "-t", str(box.pid), "-m", "--",
                          shutil.which("chroot") or "chroot", str(box.rootfs), "/bin/sh",
                          "-c", script], env={"PATH": "/bin"})
    box.helpers.append(p)
    return p


def wait_cwd(pid: int, want: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if os.readlink(f"/proc/{pid}/cwd").endswith(want):
                return
        except OSError:
            pass
        time.sleep(0.02)
    pytest.fail(f"process {pid} never got its cwd {want}")


async def test_relative_paths_resolve_against_the_containers_cwd(
        box: Box, serve: Any, tmp_path: Path) -> None:
    data = box.rootfs / "data"
    (data / "sub").mkdir()
    (data / "x").write_bytes(b"in the cwd")
    (box.rootfs / "etc" / "shadow").write_bytes(b"the box's own shadow")
    helper = start_in_box(box, "cd /data && exec sleep 600")
    wait_cwd(helper.pid, "/data")
    cc = await serve(PidResolver(helper.pid), CopyLimits(size_limit=1 << 20,
                                                         state_dir=str(tmp_path / "state")))
    r = await cc.get("x")
    assert r.status == 200 and await r.read() == b"in the cwd"
    r = await cc.post("sub/new", b"uploaded")
    assert r.status == 200, await r.text()
    assert (await r.json())["path"] == "/data/sub/new"
    assert (data / "sub" / "new").read_bytes() == b"uploaded"
    # '..' climbs to the container root and no further: the box's file, not the host's.
    r = await cc.get("../../../../../../etc/shadow")
    assert r.status == 200 and await r.read() == b"the box's own shadow"
    r = await cc.get("../../../../../../no-such-file")
    assert r.status == 404
    r = await cc.head(".")
    assert r.status == 200


# --- issue 35: a relative path resolves as the kernel resolves it ------------------------


async def test_dotdot_after_a_symlink_is_the_kernels(cc: Any, plain: tuple[Path, Path]) -> None:
    """``dir/link/../f``: the kernel follows ``link`` and then climbs from where it
    leads; a textual normpath would drop ``link/..`` and read ``dir/f``."""
    root, _ = plain
    (root / "dir").mkdir()
    (root / "other" / "sub").mkdir(parents=True)
    os.symlink("../other/sub", root / "dir" / "link")
    (root / "dir" / "f").write_bytes(b"the textual answer")
    (root / "other" / "f").write_bytes(b"the kernel's answer")
    kernel = (root / "dir" / "link" / ".." / "f").read_bytes()  # open(2) resolves it
    assert kernel == b"the kernel's answer"
    r = await cc.get("dir/link/../f")  # the DirResolver's cwd is "/"
    assert r.status == 200 and await r.read() == kernel
    r = await cc.post("dir/link/../new", b"uploaded")
    assert r.status == 200, await r.text()
    assert (await r.json())["path"] == "/other/new"
    assert (root / "other" / "new").read_bytes() == b"uploaded"


NAMES = ("a", "b", "c")
LINK_TARGETS = ("a", "b", "../a", "../..", "/a", "/b/c", "a/b", ".", "/", "c/../a", "nowhere")


def _build(where: Path, spec: list[tuple[str, str, str]]) -> None:
    """``spec``: (parent as 'a/b' or '', name, kind) with kind 'dir', 'file' or a link
    target; entries whose parent is not a directory are left out."""
    for parent, name, kind in spec:
        d = where / parent
        if not d.is_dir() or d.is_symlink() or os.path.lexists(d / name):
            continue
        if kind == "dir":
            (d / name).mkdir()
        elif kind == "file":
            (d / name).write_bytes(b"f")
        else:
            os.symlink(kind, d / name)


def _kernel(root_fd: int, rel: str) -> tuple[int, int] | None:
    """What openat2(RESOLVE_IN_ROOT) opens for ``rel`` from the root (the last
    component not followed), or None if it refuses."""
    from aggapi.agent.copy import openat2 as o2
    try:
        fd = o2.openat2(root_fd, rel, os.O_PATH | os.O_NOFOLLOW, o2.IN_CONTAINER)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def _ours(root: Any, rel: str) -> tuple[int, int] | None:
    from aggapi.status import StatusError
    try:
        fd = root.open(root.absolute(rel), os.O_PATH | os.O_NOFOLLOW)
    except (OSError, StatusError):
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


@settings(max_examples=300, deadline=None)
@given(spec=st.lists(st.tuples(st.sampled_from(["", "a", "b", "a/b", "b/c", "a/a"]),
                               st.sampled_from(NAMES),
                               st.sampled_from(("dir", "dir", "file", *LINK_TARGETS))),
                     max_size=12),
       rel=st.lists(st.sampled_from((*NAMES, "..", ".")), min_size=1, max_size=6),
       slash=st.booleans())
def test_relative_paths_open_what_the_kernel_opens(spec: list[tuple[str, str, str]],
                                                   rel: list[str], slash: bool) -> None:
    """Whatever the tree's symlinks, ``FsRoot.absolute`` names what the kernel's own
    in-root walk of the relative path opens (the root as the cwd), and stays a clean
    path inside the root."""
    import tempfile

    from aggapi.agent.copy.fsroot import FsRoot
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        _build(where, spec)
        root = FsRoot(os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        try:
            path = "/".join(rel) + ("/" if slash else "")
            assert _ours(root, path) == _kernel(root.root_fd, path), path
        finally:
            root.close()
