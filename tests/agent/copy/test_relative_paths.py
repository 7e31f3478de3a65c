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
