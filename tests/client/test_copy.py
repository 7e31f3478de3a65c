"""Copy: resumable, verified downloads and directory trees both ways (uploads:
test_copy_upload.py; hostile tars and symlinks: test_copy_hostile.py)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from aiohttp import ClientResponse

from aggapi.client import downloader as client_download
from aggapi.client import errors
from aggapi.client.connection import Connection
from aggapi.client.copy import download, upload_dir
from aggapi.client.retry import Backoff
from aggapi.serve.bodyreceiver import ResponseBody

# HOSTILE: tests/plugins/test_ncp.py imports it from here.
from tests.client.copysupport import HOSTILE, PAYLOAD, app_root, leftovers, rp, tree  # noqa: F401
from tests.client.fakeserver import FakeCluster


async def test_download_resumes_within_a_run(cluster: FakeCluster, tmp_path: Path) -> None:
    (app_root(cluster) / "data/big.bin").write_bytes(PAYLOAD)
    cluster.cut_download_after = 200_000
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        res = await download(c, rp("/data/big.bin"), dest, backoff=Backoff(first=0.01))
    assert dest.read_bytes() == PAYLOAD
    assert res.retries == 1 and res.sha256 == hashlib.sha256(PAYLOAD).hexdigest()
    gets = [r for r in cluster.requests if r["method"] == "GET"]
    assert "Range" not in gets[0]["headers"]
    assert gets[1]["headers"]["Range"].startswith("bytes=")
    assert int(gets[1]["headers"]["Range"][6:-1]) >= 131072  # continued, not restarted
    assert leftovers(tmp_path) == []


async def test_a_big_download_cut_mid_body_resumes_through_our_own_buffers(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The body is taken over from aiohttp (aggapi.serve.bodyreceiver) on both GETs: the cut
    one ends after the bytes that came, and the resumed one continues from them."""
    payload = os.urandom(9 << 20)
    (app_root(cluster) / "data/big.bin").write_bytes(payload)
    taken: list[bool] = []

    class Recorded(ResponseBody):
        def __init__(self, resp: ClientResponse) -> None:
            super().__init__(resp)
            taken.append(self.receiver is not None)

    monkeypatch.setattr(client_download, "ResponseBody", Recorded)
    cluster.cut_download_after = 3 << 20
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        res = await download(c, rp("/data/big.bin"), dest, backoff=Backoff(first=0.01))
    assert dest.read_bytes() == payload
    assert res.retries == 1 and taken == [True, True]
    gets = [r for r in cluster.requests if r["method"] == "GET"]
    assert int(gets[1]["headers"]["Range"][6:-1]) >= 3 << 20  # continued, not restarted
    assert leftovers(tmp_path) == []


async def test_download_resumes_across_runs(cluster: FakeCluster, tmp_path: Path) -> None:
    (app_root(cluster) / "data/big.bin").write_bytes(PAYLOAD)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        cluster.cut_download_after = 300_000
        with pytest.raises(errors.TransferError):
            await download(c, rp("/data/big.bin"), dest, backoff=Backoff(attempts=0))
        assert not dest.exists()
        assert leftovers(tmp_path) == [".out.bin.ncp-partial", ".out.bin.ncp-partial.json"]
        res = await download(c, rp("/data/big.bin"), dest)
    assert res.resumed_from > 0 and dest.read_bytes() == PAYLOAD
    assert cluster.requests[-1]["headers"]["Range"] == f"bytes={res.resumed_from}-"
    assert leftovers(tmp_path) == []


async def test_changed_source_restarts(cluster: FakeCluster, tmp_path: Path) -> None:
    src = app_root(cluster) / "data/big.bin"
    src.write_bytes(PAYLOAD)
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        cluster.cut_download_after = 300_000
        with pytest.raises(errors.TransferError):
            await download(c, rp("/data/big.bin"), dest, backoff=Backoff(attempts=0))
        new = os.urandom(500_000)
        src.write_bytes(new)  # another ETag: If-Range gives the whole new file
        await download(c, rp("/data/big.bin"), dest)
    assert dest.read_bytes() == new


async def test_sha_mismatch_leaves_nothing(cluster: FakeCluster, tmp_path: Path) -> None:
    (app_root(cluster) / "data/big.bin").write_bytes(PAYLOAD)
    cluster.corrupt_sha = True
    dest = tmp_path / "out.bin"
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.IntegrityError, match="sha256 mismatch"):
            await download(c, rp("/data/big.bin"), dest)
    assert not dest.exists() and leftovers(tmp_path) == []


async def test_directory_round_trip(cluster: FakeCluster, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """And the tar's chunked body is decrypted into our own buffers, not aiohttp's
    (aggapi.serve.chunktakeover)."""
    taken: list[bool] = []

    class Recorded(ResponseBody):
        def __init__(self, resp: ClientResponse) -> None:
            super().__init__(resp)
            taken.append(resp.headers.get("Transfer-Encoding") == "chunked"
                         and self.receiver is not None)

    monkeypatch.setattr(client_download, "ResponseBody", Recorded)
    src = tmp_path / "src"
    (src / "a/b").mkdir(parents=True)
    (src / "a/b/deep.txt").write_text("deep")
    (src / "top.bin").write_bytes(PAYLOAD)
    (src / "empty").write_bytes(b"")
    os.chmod(src / "empty", 0o600)
    os.symlink("a/b/deep.txt", src / "link")
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        up = await upload_dir(c, src, rp("/data/tree"))
        assert tree(app_root(cluster) / "data/tree") == tree(src)
        dest = tmp_path / "back"
        down = await download(c, rp("/data/tree"), dest)
    assert up.kind == down.kind == "dir"
    assert tree(dest) == tree(src)
    assert down.entries == len(tree(src))
    assert [p for p in leftovers(tmp_path) if p.startswith(".back")] == []
    assert taken == [True]



async def test_single_file_download_gets_the_umask(cluster: FakeCluster, tmp_path: Path) -> None:
    f = app_root(cluster) / "data/tool"
    f.write_bytes(b"#!/bin/sh\n")
    os.chmod(f, 0o6777)
    old = os.umask(0o077)
    try:
        async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
            await download(c, rp("/data/tool"), tmp_path / "tool")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "tool").st_mode) == 0o700


async def test_directory_destination_must_be_new(cluster: FakeCluster, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.LocalError, match="already exists"):
            await download(c, rp("/data"), tmp_path / "out")
