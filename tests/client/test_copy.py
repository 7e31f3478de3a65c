"""Copy: resumable, verified downloads; uploads; directory trees both ways; hostile tars."""

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
from aggapi.client.copy import RemotePath, download, upload_dir, upload_file
from aggapi.client.retry import Backoff
from aggapi.serve.bodyreceiver import ResponseBody
from aggapi.tar.stream import BLK, DIR, LNK, PAX, REG, SYM, header, pad, pax_header
from tests.client.fakeserver import FakeCluster
from tests.client.test_extract import escapes

PAYLOAD = os.urandom(700_000)


def app_root(cluster: FakeCluster) -> Path:
    return cluster.pods[("default", "web")].containers["app"]


def rp(path: str) -> RemotePath:
    return RemotePath("default", "web", path, "app")


def leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def tree(d: Path) -> dict[str, object]:
    out: dict[str, object] = {}
    for cur, dirs, files in os.walk(d):
        for n in dirs + files:
            p = Path(cur, n)
            rel = str(p.relative_to(d))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = "dir"
            else:
                out[rel] = (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode & 0o777)
    return out


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


async def test_directory_round_trip(cluster: FakeCluster, tmp_path: Path) -> None:
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


def evil(entries: bytes, complete: bool = True) -> bytes:
    out = entries
    if complete:
        out += pax_header("./", {"AGGAPI.complete": "true"}, typeflag=PAX) + header("./", DIR)
    return out + b"\0" * 1024


def reg(name: str, data: bytes = b"x") -> bytes:
    return header(name, REG, size=len(data)) + data + pad(len(data))


HOSTILE = {
    "absolute": evil(reg("/tmp/owned")),
    "dotdot": evil(reg("../owned")),
    "inner-dotdot": evil(header("a/", DIR) + reg("a/../../owned")),
    "abs-symlink": evil(header("l", SYM, linkname="/etc")),
    "escaping-symlink": evil(header("d/", DIR) + header("d/l", SYM, linkname="../../x")),
    "write-through-symlink": evil(header("s/", DIR) + header("l", SYM, linkname="s")
                                  + reg("l/x")),
    "hardlink-outside": evil(header("h", LNK, linkname="/etc/passwd")),
    "device": evil(header("dev", BLK)),
    "truncated": evil(reg("ok"), complete=False),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_hostile_tars_are_refused(cluster: FakeCluster, tmp_path: Path,
                                        case: str) -> None:
    cluster.dir_tar = HOSTILE[case]
    dest = tmp_path / "sub" / "out"
    dest.parent.mkdir()
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        if case == "truncated":  # the stream itself is broken: nothing is kept
            with pytest.raises(errors.TransferError):
                await download(c, rp("/data"), dest, backoff=Backoff(attempts=0))
            assert list(dest.parent.iterdir()) == []
        else:  # the hostile entry is refused and reported, the rest is kept
            res = await download(c, rp("/data"), dest, backoff=Backoff(attempts=0))
            assert len(res.refused) == 1, res.refused
            assert list(dest.parent.iterdir()) == [dest]
            assert escapes(dest) == []
    assert not (tmp_path / "owned").exists() and not (tmp_path / "sub/owned").exists()


@pytest.mark.parametrize("target", ["/root/.kube/config", "../../etc/passwd", "../x"])
async def test_single_symlink_download_cannot_point_outside(
        cluster: FakeCluster, tmp_path: Path, target: str) -> None:
    os.symlink(target, app_root(cluster) / "data/app.conf")
    os.symlink("sub/real.conf", app_root(cluster) / "data/ok.conf")
    dl = tmp_path / "dl"
    dl.mkdir()
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.UnsafeArchive, match="points outside"):
            await download(c, rp("/data/app.conf"), dl / "app.conf", keep_symlink=True)
        assert os.listdir(dl) == []
        res = await download(c, rp("/data/ok.conf"), dl / "ok.conf", keep_symlink=True)
    assert res.kind == "symlink" and os.readlink(dl / "ok.conf") == "sub/real.conf"


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


@pytest.mark.parametrize("old_server", [False, True])
async def test_single_symlink_download_needs_keep_symlink(
        cluster: FakeCluster, tmp_path: Path, old_server: bool) -> None:
    """Issue 24 finding 8: app.conf -> .ssh/id_ed25519 stays inside the destination's
    directory, yet is not the file asked for: refused unless asked for (-P), by the
    server (409) and by the client even if a server answers with the link anyway."""
    os.symlink(".ssh/id_ed25519", app_root(cluster) / "data/app.conf")
    cluster.symlinks_regardless = old_server
    dl = tmp_path / "dl"
    dl.mkdir()
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.AggapiError) as info:
            await download(c, rp("/data/app.conf"), dl / "app.conf",
                           backoff=Backoff(attempts=0))
        assert "symbolic link" in str(info.value)
        assert os.listdir(dl) == []
        res = await download(c, rp("/data/app.conf"), dl / "app.conf", keep_symlink=True)
    assert res.kind == "symlink" and os.readlink(dl / "app.conf") == ".ssh/id_ed25519"


async def test_upload_refuses_a_symlink_source_unless_followed(
        cluster: FakeCluster, tmp_path: Path) -> None:
    """A link a download planted (app.conf -> .ssh/id_ed25519) uploads the key only with
    -L; a directory given as a link likewise."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/id_ed25519").write_bytes(b"PRIVATE KEY")
    os.symlink(".ssh/id_ed25519", tmp_path / "app.conf")
    os.symlink(".ssh", tmp_path / "conf.d")
    async with await Connection.from_kubeconfig(str(cluster.kubeconfig())) as c:
        with pytest.raises(errors.LocalError, match="symbolic link"):
            await upload_file(c, tmp_path / "app.conf", rp("/data/app.conf"))
        with pytest.raises(errors.LocalError, match="symbolic link"):
            await upload_dir(c, tmp_path / "conf.d", rp("/data/conf.d"))
        assert not (app_root(cluster) / "data/app.conf").exists()
        res = await upload_file(c, tmp_path / "app.conf", rp("/data/app.conf"),
                                follow_links=True)
    assert res.size == len(b"PRIVATE KEY")
    assert (app_root(cluster) / "data/app.conf").read_bytes() == b"PRIVATE KEY"


async def test_upload_reads_the_file_it_opened(cluster: FakeCluster, tmp_path: Path) -> None:
    """The source is opened once: replacing its name by a link afterwards (between the
    hash and the body, or between retries) changes nothing that is sent."""
    from aggapi.client.copy import open_source

    src = tmp_path / "f"
    src.write_bytes(b"original")
    fd, st = open_source(src)
    try:
        os.unlink(src)
        os.symlink("/etc/passwd", src)
        assert os.pread(fd, 100, 0) == b"original" and stat.S_ISREG(st.st_mode)
    finally:
        os.close(fd)
    with pytest.raises(errors.LocalError, match="symbolic link"):
        open_source(src)
    fd, _ = open_source(src, follow_links=True)
    os.close(fd)


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
