"""Copy: uploads of a file (its sha after or before its bytes, a file that shrinks) and of
trees (read once for hash and send, sent while packed, sent again whole when cut)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from aggapi.client import errors
from aggapi.client.connection import Connection
from aggapi.client.copy import upload_dir, upload_file
from aggapi.client.retry import Backoff
from tests.client.copysupport import PAYLOAD, app_root, rp, tree
from tests.client.fakeserver import FakeCluster


async def test_upload_file_sends_its_sha_after_its_bytes(cluster: FakeCluster,
                                                          tmp_path: Path) -> None:
    """One pass over the file (issue 27): sha256=trailer, and Content-Length counts the
    32 raw digest bytes that follow the file's."""
    src = tmp_path / "in.bin"
    src.write_bytes(PAYLOAD)
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        res = await upload_file(c, src, rp("/data/in.bin"), mode=0o640)
    assert (app_root(cluster) / "data/in.bin").read_bytes() == PAYLOAD
    assert (app_root(cluster) / "data/in.bin").stat().st_mode & 0o777 == 0o640
    assert res.sha256 == hashlib.sha256(PAYLOAD).hexdigest()
    assert len(cluster.requests) == 1
    assert dict(cluster.requests[-1]["query"])["sha256"] == "trailer"
    assert cluster.requests[-1]["headers"]["Content-Length"] == str(len(PAYLOAD) + 32)


async def test_upload_file_to_an_agent_without_trailers_sends_the_sha_up_front(
        cluster: FakeCluster, tmp_path: Path) -> None:
    """An agent that predates sha256=trailer refuses it before writing; the client then
    hashes first and sends the digest in the query (a mixed-version cluster mid-upgrade)."""
    cluster.no_sha256_trailer = True
    src = tmp_path / "in.bin"
    src.write_bytes(PAYLOAD)
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        res = await upload_file(c, src, rp("/data/in.bin"))
    assert (app_root(cluster) / "data/in.bin").read_bytes() == PAYLOAD
    assert [dict(r["query"])["sha256"] for r in cluster.requests] == \
        ["trailer", hashlib.sha256(PAYLOAD).hexdigest()] == ["trailer", res.sha256]
    assert cluster.requests[-1]["headers"]["Content-Length"] == str(len(PAYLOAD))


async def test_upload_of_a_file_that_shrinks_while_sent_fails_and_commits_nothing(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never more, and never less, than the size announced: a file cut short while it is
    sent is an error, not a shorter copy."""
    from aggapi.client import uploader as cp

    src = tmp_path / "in.bin"
    src.write_bytes(PAYLOAD)
    monkeypatch.setattr(cp, "CHUNK", 1 << 16)
    real = cp._read

    def shrink_then_read(fd: int, n: int, off: int, h: object) -> bytes:
        if off >= 1 << 17:
            os.truncate(src, 1 << 17)
        return real(fd, n, off, h)

    monkeypatch.setattr(cp, "_read", shrink_then_read)
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.AggapiError, match="shrank"):
            await upload_file(c, src, rp("/data/in.bin"), backoff=Backoff(attempts=1))
    assert not (app_root(cluster) / "data/in.bin").exists()


@pytest.mark.parametrize("agent, read_once_max, reads, claim", [
    ("new", 1024, 1, "headers-trailer"), ("new", 64 << 20, 1, "headers-trailer"),
    ("trailer", 1024, 1, "trailer"), ("trailer", 64 << 20, 1, "trailer"),
    ("old", 64 << 20, 1, ""), ("old", 1024, 2, "")])
async def test_a_tree_is_read_once_for_hash_and_send(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        agent: str, read_once_max: int, reads: int, claim: str) -> None:
    """Issue 27: every file of a tree is read once, its data hashed once for its own
    record, the rest of the tar for the headers digest, sent after the tar
    (sha256=headers-trailer), whatever the tree's size. An agent that predates the
    headers digest gets the whole tar's sha256 as a trailer; one that predates the
    trailer too gets it up front, from the tar built and kept (READ_ONCE_MAX) or from a
    first pass, the tar built again for sending (bounded memory). All arrive whole,
    under the claim sent."""
    from aggapi.client import packtar
    from aggapi.client import uploaddir as copy_mod

    cluster.no_headers_digest = agent != "new"
    cluster.no_sha256_trailer = agent == "old"
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    files = {f"d/f{i}": os.urandom(700 * i) for i in range(12)}
    for rel, data in files.items():
        (src / rel).write_bytes(data)
    opened: list[str] = []
    real_open = os.open

    def spy(path: str | os.PathLike[str], flags: int, *a: object, **kw: object) -> int:
        opened.append(os.fspath(path))
        return real_open(path, flags, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(copy_mod, "READ_ONCE_MAX", read_once_max)
    monkeypatch.setattr(packtar.os, "open", spy)
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        up = await upload_dir(c, src, rp("/data/once"))
    monkeypatch.undo()
    assert tree(app_root(cluster) / "data/once") == tree(src)
    mine = [p for p in opened if p.startswith(f"{src}/")]  # not the fake server's
    times = {mine.count(str(src / rel)) for rel in files}
    # Refused, a streamed attempt may have read some files before its 400 came back.
    assert times == {reads} if agent == "new" else times <= {reads, reads + 1, reads + 2}
    assert len(mine) >= reads * len(files)
    sent = [dict(r["query"])["sha256"] for r in cluster.requests if r["method"] == "POST"]
    assert sent[-1] == {"": up.sha256}.get(claim, claim)
    if agent != "new":  # the headers digest was refused first (before any file was placed)
        assert sent[0] == "headers-trailer"
        assert len(sent) == {"trailer": 2, "old": 3}[agent]


async def test_a_small_tree_is_sent_while_it_is_packed(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 27 item 3: a tree far below READ_ONCE_MAX is not built before its request:
    the upload is on the wire while its last file is still unread (that open waits for
    the server to have the request), so the agent's extraction overlaps the packing."""
    import time

    from aggapi.client import packtar

    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(packtar.CHUNK + 4096))  # the first MiB goes
    (src / "z.txt").write_bytes(b"last")
    seen: list[bool] = []
    real_open = os.open

    def waiting_open(path: str | os.PathLike[str], flags: int, *a: object,
                     **kw: object) -> int:
        if os.fspath(path) == str(src / "z.txt"):  # in the packing worker thread
            deadline = time.monotonic() + 5
            while not any(r["method"] == "POST" for r in cluster.requests) \
                    and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(any(r["method"] == "POST" for r in cluster.requests))
        return real_open(path, flags, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(packtar.os, "open", waiting_open)
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        up = await upload_dir(c, src, rp("/data/streamed"))
    assert seen == [True]
    assert tree(app_root(cluster) / "data/streamed") == tree(src)
    sent = [dict(r["query"])["sha256"] for r in cluster.requests if r["method"] == "POST"]
    assert sent == ["headers-trailer"] and up.retries == 0


@pytest.mark.parametrize("agent", ["new", "old"])
@pytest.mark.parametrize("kept", [True, False])
async def test_a_cut_directory_upload_is_sent_again_whole(
        cluster: FakeCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, agent: str,
        kept: bool) -> None:
    """A tree whose upload is cut mid-body is sent again from its start (the agent
    committed nothing of the cut one) under the same claim: built again with a fresh
    digest trailer, whatever its size; for an agent that wants the whole tar's digest
    first, that digest again (a tar up to READ_ONCE_MAX kept and replayed)."""
    from aggapi.client import uploaddir as copy_mod

    cluster.no_headers_digest = cluster.no_sha256_trailer = agent == "old"
    if not kept:
        monkeypatch.setattr(copy_mod, "READ_ONCE_MAX", 0)
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    for i in range(40):
        (src / f"d/f{i:02d}").write_bytes(os.urandom(50_000))
    # Refusals come before the cut is armed: the first request that is read is cut.
    cluster.cut_upload_after = 700_000
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        up = await upload_dir(c, src, rp("/data/again"), backoff=Backoff(first=0.01))
    assert tree(app_root(cluster) / "data/again") == tree(src)
    assert up.retries == 1
    sent = [dict(r["query"])["sha256"] for r in cluster.requests if r["method"] == "POST"]
    if agent == "new":
        assert sent == ["headers-trailer", "headers-trailer"]
    else:  # the headers digest and the trailer refused, then the tar's sha256 twice
        assert sent == ["headers-trailer", "trailer", up.sha256, up.sha256]
