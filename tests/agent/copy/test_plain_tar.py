"""A raw directory download is a tar any tar extracts safely (issue 35):
``kubectl get --raw ".../copy?path=DIR" | tar x``, run as an unprivileged user in a
fresh 0700 directory, must leave that directory's mode and time alone (the closing
``./`` entry carried the container directory's mode, owner and time) and print no
warning (GNU tar warned about every ``AGGAPI.*`` record). The records and the closing
entry come only when asked with ``digest`` (ncp asks ``digest=trailer``).

Real GNU tar and bsdtar (libarchive-tools), run as ``nobody`` through setpriv, on the
agent's real download handler over a plain-directory container."""

from __future__ import annotations

import io
import os
import pwd
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

OLD = 1_000_000_000  # 2001: the container directory's time
TOOLS = {"gnu-tar": ["tar", "-xf", "-"], "bsdtar": ["bsdtar", "-xf", "-"]}


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A fresh 0700 directory owned by nobody, its time set long ago, reachable by it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run tar as nobody")
    base = Path(tempfile.mkdtemp(prefix="aggapi-plain-tar-"))
    try:
        base.chmod(0o711)
        d = base / "here"
        d.mkdir(mode=0o700)
        pw = pwd.getpwnam("nobody")
        os.chown(d, pw.pw_uid, pw.pw_gid)
        d.chmod(0o700)
        yield d
    finally:
        shutil.rmtree(base)


def container_tree(root: Path) -> dict[str, bytes]:
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(3 << 20), "sub/deep/c": b""}
    for rel, data in files.items():
        (root / "data" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "data" / rel).write_bytes(data)
    (root / "data").chmod(0o755)
    os.utime(root / "data", (OLD, OLD))
    return files


def as_nobody(cmd: list[str], cwd: Path, data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                           *cmd], input=data, cwd=cwd, capture_output=True, check=False)


@pytest.mark.parametrize("tool", list(TOOLS))
async def test_a_raw_download_extracts_silently_and_leaves_the_directory_alone(
        cc: Any, plain: tuple[Path, Path], nobody_dir: Path, tool: str) -> None:
    if shutil.which(TOOLS[tool][0]) is None:
        pytest.fail(f"{TOOLS[tool][0]} is not installed (hack/install-deps.sh installs it)")
    files = container_tree(plain[0])
    resp = await cc.get("/data")
    assert resp.status == 200
    raw = await resp.read()
    check_extraction(TOOLS[tool], raw, nobody_dir, files)


def check_extraction(cmd: list[str], raw: bytes, d: Path, files: dict[str, bytes]) -> None:
    os.utime(d, (OLD + 7, OLD + 7))
    before = time.time()
    done = as_nobody(cmd, d, raw)
    assert done.returncode == 0, done.stderr
    assert done.stderr == b""  # no "unknown extended header keyword" warning
    st = d.stat()
    assert oct(st.st_mode & 0o7777) == oct(0o700)
    assert st.st_mtime >= before - 1  # not set back to the container directory's
    for rel, data in files.items():
        assert (d / rel).read_bytes() == data


async def test_only_a_download_that_asks_gets_the_records(
        cc: Any, plain: tuple[Path, Path]) -> None:
    container_tree(plain[0])
    resp = await cc.get("/data")
    raw = await resp.read()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        members = tf.getmembers()
        assert not any(m.name.strip("/") in ("", ".") for m in members)
        assert not any(k.startswith("AGGAPI.") for m in members for k in m.pax_headers)
        assert not any(k.startswith("AGGAPI.") for k in tf.pax_headers)
    for digest in ("trailer", "entry"):
        resp = await cc.get("/data", query={"digest": digest})
        asked = await resp.read()
        assert b"AGGAPI.complete=true" in asked and b"AGGAPI.entryDigests" in asked
