"""Copies act as the container process's user (finding 9), over HTTP with the real
handlers, against a plain-directory container whose "process" is uid 1000.

The root directory is a 0755 directory under /tmp (pytest's tmp dirs are 0700
and would refuse uid 1000 for the wrong reason). The in-flight records stay in
the agent's 0700 state dir: they are written as the agent.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy.creds import Creds
from aggapi.agent.copy.fsroot import FsRoot
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import POD_UID, temp_leftovers
from tests.tarcraft import pax_tar

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root, as the agent")

USER = Creds(1000, 1000, (1000,))


class UserDirResolver:
    """A directory as the container root; copies act as ``creds`` (None: --copy-as-root)."""

    def __init__(self, root: Path, creds: Creds | None) -> None:
        self.root = root
        self.creds = creds

    async def resolve(self, pod_uid: str, container: str) -> FsRoot:
        return FsRoot(os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC),
                      container_id="dir-container", pod_uid=POD_UID, container_name="c",
                      creds=self.creds)

    async def by_id(self, container_id: str) -> FsRoot | None:
        return None


@pytest.fixture
def croot() -> Iterator[Path]:
    """A container tree: root-owned 0755 dirs, a 0600 root secret, a home owned by 1000."""
    d = Path(tempfile.mkdtemp(prefix="aggapi-asuser-", dir="/tmp"))
    d.chmod(0o755)
    (d / "etc").mkdir(mode=0o755)
    (d / "etc" / "shadow").write_bytes(b"root:secret\n")
    (d / "etc" / "shadow").chmod(0o600)
    (d / "etc" / "motd").write_bytes(b"hello\n")
    (d / "etc" / "motd").chmod(0o644)
    home = d / "home"
    home.mkdir(mode=0o755)
    os.chown(home, 1000, 1000)
    try:
        yield d
    finally:
        shutil.rmtree(d)


@pytest.fixture
async def as_user(croot: Path, serve: Any, limits: CopyLimits) -> Any:
    return await serve(UserDirResolver(croot, USER), limits)


@pytest.fixture
async def as_root(croot: Path, serve: Any, limits: CopyLimits) -> Any:
    return await serve(UserDirResolver(croot, None), limits)



async def test_reading_a_root_only_file_is_403(as_user: Any) -> None:
    r = await as_user.get("/etc/shadow")
    assert r.status == 403, await r.text()
    body = await r.json()
    assert body["kind"] == "Status" and b"secret" not in await r.read()
    assert body["message"] == ("/etc/shadow: permission denied (copies act as the container's "
                               "user, uid 1000 gid 1000)")
    r = await as_user.get("/etc/motd")
    assert r.status == 200 and await r.read() == b"hello\n"


async def test_writing_into_a_root_dir_is_403(as_user: Any, croot: Path) -> None:
    r = await as_user.post("/etc/new", b"x")
    assert r.status == 403, await r.text()
    assert not (croot / "etc" / "new").exists()
    r = await as_user.post("/etc/motd", b"replaced")
    assert r.status == 403, await r.text()
    assert (croot / "etc" / "motd").read_bytes() == b"hello\n"
    r = await as_user.post("/etc/sub", pax_tar({"a": b"a"}), format="tar")
    assert r.status == 403, await r.text()
    assert not (croot / "etc" / "sub").exists()
    assert temp_leftovers(croot) == []


async def test_writing_into_the_home_works_and_belongs_to_the_user(
        as_user: Any, croot: Path, limits: CopyLimits) -> None:
    r = await as_user.post("/home/notes.txt", b"mine")
    assert r.status == 200, await r.text()
    st = (croot / "home" / "notes.txt").stat()
    assert (st.st_uid, st.st_gid) == (1000, 1000)
    r = await as_user.post("/home/tree", pax_tar({"a/b": b"b", "c": b"c"}, {"d": "c"}),
                           format="tar")
    assert r.status == 200, await r.text()
    for p in ("tree", "tree/a", "tree/a/b", "tree/c", "tree/d"):
        st = (croot / "home" / p).stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), p
    assert (croot / "home" / "tree" / "d").stat().st_ino == \
        (croot / "home" / "tree" / "c").stat().st_ino
    assert temp_leftovers(croot) == [] and os.listdir(limits.state_dir) == []


async def test_a_user_cannot_give_files_away(as_user: Any, croot: Path) -> None:
    for params in ({"uid": "0"}, {"gid": "0"}, {"uid": "2000", "gid": "2000"}):
        r = await as_user.post("/home/given", b"x", **params)
        assert r.status == 403, (params, await r.text())
        assert not (croot / "home" / "given").exists()
    # Its own ids and a mode with setgid on its own group are fine.
    r = await as_user.post("/home/own", b"x", uid="1000", gid="1000", mode="2755")
    assert r.status == 200, await r.text()
    st = (croot / "home" / "own").stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1000, 1000, 0o2755)
    assert temp_leftovers(croot) == []


async def test_replacing_a_root_file_in_the_home_gives_it_to_the_user(
        as_user: Any, croot: Path) -> None:
    f = croot / "home" / "rootfile"
    f.write_bytes(b"old")
    f.chmod(0o640)
    r = await as_user.post("/home/rootfile", b"new")
    assert r.status == 200, await r.text()
    st = f.stat()
    assert (st.st_uid, st.st_mode & 0o777, f.read_bytes()) == (1000, 0o640, b"new")


async def test_copy_as_root_reads_and_writes_everything(as_root: Any, croot: Path) -> None:
    r = await as_root.get("/etc/shadow")
    assert r.status == 200 and await r.read() == b"root:secret\n"
    r = await as_root.post("/etc/new", b"x")
    assert r.status == 200, await r.text()
    assert (croot / "etc" / "new").stat().st_uid == 0


@pytest.mark.parametrize("digest", ["entry", "trailer"])  # trailer: the compiled walk's
async def test_a_directory_download_skips_what_the_user_cannot_read(
        as_user: Any, croot: Path, digest: str) -> None:
    etc = croot / "etc"
    (etc / "private").mkdir(mode=0o700)
    (etc / "private" / "key").write_bytes(b"k")
    (etc / "listonly").mkdir()
    (etc / "listonly" / "f").write_bytes(b"f")
    (etc / "listonly").chmod(0o744)  # names readable, entries not reachable
    os.link(etc / "shadow", etc / "shadow-link")
    r = await as_user.get("/etc", query={"digest": digest})  # with the skipped report
    assert r.status == 200, await r.text()
    body = await r.read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:") as tf:
        members = tf.getmembers()
        assert tf.extractfile("motd").read() == b"hello\n"  # type: ignore[union-attr]
    names = {m.name for m in members}
    assert b"root:secret" not in body
    assert not names & {"shadow", "shadow-link", "private/key", "listonly/f"}
    skipped = {s["path"]: s["reason"] for s in json.loads(members[-1].pax_headers[
        "AGGAPI.skipped"])}
    for p in ("shadow", "shadow-link", "private", "listonly/f"):
        assert skipped[p] == "permission denied", (p, skipped)


async def test_a_users_stat_of_another_process_magic_link_has_no_target(
        serve: Any, limits: CopyLimits) -> None:
    # The host's / as the container, uid 1000: the agent's own /proc/<pid>/exe is a magic
    # link that user may not follow. Stat (of the link itself, as GET's symlink=keep)
    # answers, without the target.
    cc = await serve(UserDirResolver(Path("/"), USER), limits)
    for path in (f"/proc/{os.getpid()}/exe", "/proc/1/cwd"):
        r = await cc.head(path, query={"symlink": "keep"})
        assert r.status == 200, (path, await r.text())
        st = json.loads(base64.b64decode(r.headers["X-Aggapi-Stat"]))
        assert st["type"] == "symlink" and st["linkTarget"] == "", (path, st)
