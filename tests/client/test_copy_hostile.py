"""Copy: hostile tars refused, symlinks that would lead a download or an upload outside
what was asked for."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from aggapi.client import errors
from aggapi.client.connection import Connection
from aggapi.client.copy import download, upload_dir, upload_file
from aggapi.client.retry import Backoff
from tests.client.copysupport import HOSTILE, app_root, rp
from tests.client.fakeserver import FakeCluster
from tests.client.test_extract import escapes


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
