"""digest=trailer downloads from the client's side (issue 27): it asks for the sha256
after the data, holds the last 32 bytes back from the file, and verifies before it
publishes; an agent that predates the trailer answers with the digest up front."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from aggapi import wire
from aggapi.client import errors
from aggapi.client.connection import Connection
from aggapi.client.copy import RemotePath, download
from aggapi.client.retry import Backoff
from tests.client.fakeserver import FakeCluster

PAYLOAD = os.urandom(700_000)


def _setup(cluster: FakeCluster) -> None:
    (cluster.pods[("default", "web")].containers["app"] / "data/f.bin").write_bytes(PAYLOAD)


def _rp() -> RemotePath:
    return RemotePath("default", "web", "/data/f.bin", "app")


def _gets(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [r for r in cluster.requests if r["method"] == "GET"]


def _left(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def _out(tmp_path: Path) -> Path:
    d = tmp_path / "out"
    d.mkdir()
    return d


@pytest.mark.parametrize("old_agent", [False, True])
async def test_a_download_is_verified_in_either_form(cluster: FakeCluster, tmp_path: Path,
                                                     old_agent: bool) -> None:
    """The client always asks for the trailer; an old agent ignores the parameter and
    sends X-Aggapi-Sha256 up front, which the client then verifies as before."""
    _setup(cluster)
    cluster.no_download_trailer = old_agent
    tmp_path = _out(tmp_path)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        res = await download(c, _rp(), dest)
    assert dest.read_bytes() == PAYLOAD  # the trailer is not part of the file
    assert res.sha256 == hashlib.sha256(PAYLOAD).hexdigest() and res.size == len(PAYLOAD)
    assert dict(_gets(cluster)[0]["query"])[wire.PARAM_DIGEST] == wire.DIGEST_TRAILER
    assert _left(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("at", [0, 1, len(PAYLOAD) // 2, len(PAYLOAD) - 1,  # the data
                                len(PAYLOAD), len(PAYLOAD) + 31])  # the trailer
async def test_a_flipped_byte_of_data_or_trailer_publishes_nothing(
        cluster: FakeCluster, tmp_path: Path, at: int) -> None:
    _setup(cluster)
    cluster.flip_byte = at
    tmp_path = _out(tmp_path)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.IntegrityError, match=r"sha256 mismatch for /data/f\.bin"):
            await download(c, _rp(), dest)
    assert _left(tmp_path) == []


@pytest.mark.parametrize("across_runs", [False, True])
async def test_a_dropped_trailer_download_resumes_verified_end_to_end(
        cluster: FakeCluster, tmp_path: Path, across_runs: bool) -> None:
    """The 206 ends with the whole file's sha256, checked against the bytes already
    here (hashed when the partial file was taken up) and those that follow."""
    _setup(cluster)
    tmp_path = _out(tmp_path)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        cluster.cut_download_after = 300_000
        if across_runs:
            with pytest.raises(errors.TransferError):
                await download(c, _rp(), dest, backoff=Backoff(attempts=0))
            assert ".out.bin.ncp-partial" in _left(tmp_path)
        res = await download(c, _rp(), dest, backoff=Backoff(first=0.01))
    assert dest.read_bytes() == PAYLOAD and _left(tmp_path) == ["out.bin"]
    resumed = _gets(cluster)[-1]
    assert resumed["headers"]["Range"].startswith("bytes=")
    assert int(resumed["headers"]["Range"][6:-1]) >= 131072
    assert dict(resumed["query"])[wire.PARAM_DIGEST] == wire.DIGEST_TRAILER
    assert res.sha256 == hashlib.sha256(PAYLOAD).hexdigest()


async def test_a_resumed_download_whose_prefix_differs_is_refused(
        cluster: FakeCluster, tmp_path: Path) -> None:
    """The bytes kept from the cut attempt are part of what the trailer verifies: a
    partial file changed here (same length) fails the resumed download."""
    _setup(cluster)
    tmp_path = _out(tmp_path)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        cluster.cut_download_after = 300_000
        with pytest.raises(errors.TransferError):
            await download(c, _rp(), dest, backoff=Backoff(attempts=0))
        part = tmp_path / ".out.bin.ncp-partial"
        with open(part, "r+b") as f:  # noqa: ASYNC230 (a local test file)
            f.write(b"\xff")
        with pytest.raises(errors.IntegrityError, match="sha256 mismatch"):
            await download(c, _rp(), dest)
    assert _left(tmp_path) == []


@pytest.mark.parametrize("framing", ["short", "extra"])
async def test_a_reply_not_framed_as_file_and_trailer_is_refused(
        cluster: FakeCluster, tmp_path: Path, framing: str) -> None:
    """Content-Length shorter than a trailer, or more than the file's stat size and
    one: refused before any byte is written (memory bounded by the checked length)."""
    _setup(cluster)
    cluster.trailer_framing = framing
    tmp_path = _out(tmp_path)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.TransferError, match="not framed as a file"):
            await download(c, _rp(), dest, backoff=Backoff(attempts=0))
    assert not dest.exists()


async def test_a_body_cut_inside_its_trailer_is_not_published_and_is_fetched_again(
        cluster: FakeCluster, tmp_path: Path) -> None:
    """All the data came but only part of its trailer: nothing is published from that
    attempt; the retry (the data is complete: 416, so from the start) verifies."""
    _setup(cluster)
    cluster.trailer_framing = "cut"
    tmp_path = _out(tmp_path)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.TransferError):
            await download(c, _rp(), dest, backoff=Backoff(attempts=0))
        assert not dest.exists()
        res = await download(c, _rp(), dest, backoff=Backoff(first=0.01))
    assert dest.read_bytes() == PAYLOAD and res.sha256 == hashlib.sha256(PAYLOAD).hexdigest()


@pytest.mark.parametrize("old_agent", [False, True])
async def test_a_directory_download_is_verified_file_by_file_in_either_form(
        cluster: FakeCluster, tmp_path: Path, old_agent: bool) -> None:
    """Asked with digest=trailer, a tree's digests follow their files; an agent that
    predates it sends each in the file's own entry. Both are checked file by file."""
    src = cluster.pods[("default", "web")].containers["app"] / "data/tree"
    files = {"a.bin": os.urandom(300_000), "b/c.txt": b"hello\n", "b/empty": b""}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    cluster.no_download_trailer = old_agent
    dest = _out(tmp_path) / "tree"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        res = await download(c, RemotePath("default", "web", "/data/tree", "app"), dest)
    assert res.kind == "dir" and res.verified
    assert {rel: (dest / rel).read_bytes() for rel in files} == files
    assert dict(_gets(cluster)[0]["query"])[wire.PARAM_DIGEST] == wire.DIGEST_TRAILER
