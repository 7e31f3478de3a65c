"""The AGGAPI.sha256 record (aggapi.tar.entrydigest) keeps our tars plain tars: GNU tar,
busybox tar and Python's tarfile extract both sides' directory tars as they are (the
vendor records ignored), and the writer sizes headers that carry the record exactly."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from aggapi.agent.copy import tarwalk as download
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.client import packtar
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import PLACEHOLDER, record
from tests.filetrees import read_tree, write_tree

TREE = {"a/one": b"1" * 5000, "a/b/two": b"", "three": os.urandom((1 << 20) + 3),
        "é" * 70: b"long non-ascii name"}


def client_tar(src: Path) -> bytes:
    async def collect() -> bytes:
        return b"".join([c async for c in packtar.tar_stream(src, packtar.list_tree(src))])
    return asyncio.run(collect())


def agent_tar(src: Path) -> bytes:
    root = FsRoot(os.open(src, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), container_id="t")
    dfd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return b"".join(download.TarWalker(root, dfd, CopyLimits(state_dir="/x")).chunks())
    finally:
        os.close(dfd)
        os.close(root.root_fd)


TOOLS = {
    "gnu-tar": ["tar", "-xf", "-"],
    "busybox": ["busybox", "tar", "-xf", "-"],
}


@pytest.mark.parametrize("side", ["client", "agent"])
@pytest.mark.parametrize("tool", [*TOOLS, "tarfile"])
def test_ordinary_tar_extracts_our_tars(tmp_path: Path, side: str, tool: str) -> None:
    write_tree(tmp_path / "src", TREE)
    raw = (client_tar if side == "client" else agent_tar)(tmp_path / "src")
    assert raw.count(b"AGGAPI.sha256=") == len(TREE)
    out = tmp_path / "out"
    out.mkdir()
    if tool == "tarfile":
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
            tf.extractall(out, filter="tar")
    else:
        if shutil.which(TOOLS[tool][0]) is None:
            pytest.skip(f"{TOOLS[tool][0]} is not installed")
        done = subprocess.run(TOOLS[tool], input=raw, cwd=out, capture_output=True,
                              check=False)
        assert done.returncode == 0, done.stderr
    assert read_tree(out) == TREE


def test_header_size_counts_the_record() -> None:
    digest = hashlib.sha256(b"x").hexdigest()
    for name in ("f", "d" * 99, "é" * 80):
        for size in (0, 1, 8 ** 11):
            assert len(ts.header(name, ts.REG, size=size, records=record(digest))) == \
                ts.header_size(name, size=size, records=PLACEHOLDER)
