"""The copy endpoint end to end over HTTP, against a plain-directory container."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import stat
import subprocess
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver, temp_leftovers


def stat_of(resp: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(base64.b64decode(resp.headers["X-Aggapi-Stat"]))
    return doc


async def test_upload_then_download_round_trip(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    data = os.urandom(3 * 1024 * 1024 + 17)
    digest = hashlib.sha256(data).hexdigest()
    r = await cc.post("/file.bin", data, sha256=digest)
    assert r.status == 200, await r.text()
    assert await r.json() == {"path": "/file.bin", "size": len(data), "sha256": digest}
    assert (root / "file.bin").read_bytes() == data
    assert stat.S_IMODE((root / "file.bin").stat().st_mode) == 0o644
    r = await cc.get("/file.bin")
    assert r.status == 200
    body = await r.read()
    assert body == data
    assert r.headers["X-Aggapi-Sha256"] == digest
    assert r.headers["Digest"] == "sha-256=" + base64.b64encode(bytes.fromhex(digest)).decode()
    assert r.headers["Content-Length"] == str(len(data))
    st = stat_of(r)
    assert st["name"] == "file.bin" and st["size"] == len(data) and st["type"] == "file"
    assert temp_leftovers(root) == []


async def test_head_returns_stat_only(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "d").mkdir()
    os.symlink("/etc/shadow", root / "d" / "ln")
    r = await cc.head("/d/ln", query={"symlink": "keep"})  # as GET: the link itself
    assert r.status == 200
    st = stat_of(r)
    assert st["type"] == "symlink" and st["linkTarget"] == "/etc/shadow"
    r = await cc.head("/d")
    assert stat_of(r)["type"] == "dir"
    # Only a regular file has a content digest.
    for path in ("/d/ln", "/d"):
        r = await cc.head(path, query={"symlink": "keep"})
        assert not {"X-Aggapi-Sha256", "Digest", "Repr-Digest"} & set(r.headers)


DIGEST_HEADERS = ("X-Aggapi-Sha256", "Digest", "Repr-Digest")


async def test_head_sends_the_digest_headers_get_sends(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    data = os.urandom(300_000)
    (root / "f").write_bytes(data)
    head = await cc.head("/f")
    assert head.status == 200
    got = await cc.get("/f")
    assert await got.read() == data
    raw = hashlib.sha256(data).digest()
    assert {h: head.headers[h] for h in DIGEST_HEADERS} == \
        {h: got.headers[h] for h in DIGEST_HEADERS} == {
            "X-Aggapi-Sha256": raw.hex(),
            "Digest": "sha-256=" + base64.b64encode(raw).decode(),
            "Repr-Digest": "sha-256=:" + base64.b64encode(raw).decode() + ":"}
    # A changed file gets a new digest on HEAD (the cache is keyed by file version).
    (root / "f").write_bytes(b"other")
    head = await cc.head("/f")
    assert head.headers["X-Aggapi-Sha256"] == hashlib.sha256(b"other").hexdigest()


async def test_range_resume_and_if_range(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    data = os.urandom(2_500_000)
    (root / "f").write_bytes(data)
    full = await cc.get("/f")
    tag = full.headers["ETag"]
    part = (await full.content.read(1_000_000))
    full.close()
    r = await cc.get("/f", headers={"Range": f"bytes={len(part)}-", "If-Range": tag})
    assert r.status == 206
    assert r.headers["Content-Range"] == f"bytes {len(part)}-{len(data) - 1}/{len(data)}"
    rest = await r.read()
    assert part + rest == data
    assert r.headers["X-Aggapi-Sha256"] == hashlib.sha256(data).hexdigest()
    # The file changes: If-Range no longer matches, the whole file comes back.
    (root / "f").write_bytes(b"changed")
    r = await cc.get("/f", headers={"Range": "bytes=3-", "If-Range": tag})
    assert r.status == 200 and await r.read() == b"changed"
    r = await cc.get("/f", headers={"Range": "bytes=100-"})
    assert r.status == 416 and r.headers["Content-Range"] == "bytes */7"


async def test_checksum_mismatch_leaves_target_unchanged(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "t").write_bytes(b"original")
    r = await cc.post("/t", b"new content", sha256="0" * 64)
    assert r.status == 400
    body = await r.json()
    assert body["kind"] == "Status" and "sha256 mismatch" in body["message"]
    assert (root / "t").read_bytes() == b"original"
    assert temp_leftovers(root) == []


async def test_overwrite_false_and_existing_directory(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "t").write_bytes(b"original")
    (root / "dir").mkdir()
    r = await cc.post("/t", b"x", overwrite="false")
    assert r.status == 409
    assert (root / "t").read_bytes() == b"original"
    r = await cc.post("/dir", b"x")
    assert r.status == 409
    assert (await cc.post("/new", b"x", overwrite="false")).status == 200


async def test_mode_owner_and_setid(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    r = await cc.post("/s", b"#!/bin/sh\n", mode="4755", uid="1234", gid="55")
    assert r.status == 200, await r.text()
    st = (root / "s").stat()
    assert stat.S_IMODE(st.st_mode) == 0o4755 and (st.st_uid, st.st_gid) == (1234, 55)
    # Replacing keeps owner and mode, minus setuid (only an explicit mode= sets it).
    r = await cc.post("/s", b"#!/bin/sh\necho\n")
    st = (root / "s").stat()
    assert stat.S_IMODE(st.st_mode) == 0o755 and (st.st_uid, st.st_gid) == (1234, 55)


async def test_params_must_match_capability(cc: Any, plain: tuple[Path, Path]) -> None:
    r = await cc.post("/x", b"x", query_extra={"uid": "0"})  # not vouched for
    assert r.status == 403
    r = await cc.post("/x", b"x", query_extra={"mode": "0777"}, mode="0644")
    assert r.status == 403
    r = await cc.post("/x", b"x", cap_path="/y")
    assert r.status == 403
    assert not (plain[0] / "x").exists()


async def test_oversize_upload_is_413(plain: tuple[Path, Path], serve: Any,
                                      limits: CopyLimits) -> None:
    small = CopyLimits(size_limit=1 << 20, state_dir=limits.state_dir)
    cc = await serve(DirResolver(plain[0]), small)
    r = await cc.post("/big", b"x" * ((1 << 20) + 1))
    assert r.status == 413

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: caught while streaming
        for _ in range(3):
            yield b"y" * (512 * 1024)

    r = await cc.post("/big", chunked())
    assert r.status == 413
    assert not (plain[0] / "big").exists() and temp_leftovers(plain[0]) == []


async def test_copies_past_the_limit_get_429(plain: tuple[Path, Path], serve: Any,
                                             limits: CopyLimits) -> None:
    lim = CopyLimits(copies_per_pod=2, state_dir=limits.state_dir)
    cc = await serve(DirResolver(plain[0]), lim)
    gate = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield b"a"
        await gate.wait()
        yield b"b"

    running = [asyncio.create_task(cc.post(f"/f{i}", slow())) for i in range(2)]
    while cc.state.slots.total < 2:  # noqa: ASYNC110 - polls the server's own counter
        await asyncio.sleep(0.01)
    r = await cc.post("/f3", b"x")
    assert r.status == 429
    assert r.headers["Retry-After"] == str(lim.retry_after)
    gate.set()
    assert [x.status for x in await asyncio.gather(*running)] == [200, 200]
    assert (await cc.post("/f3", b"x")).status == 200


@pytest.fixture
def tmpfs(plain: tuple[Path, Path]) -> Iterator[Path]:
    mnt = plain[0] / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


async def test_enospc_is_507(cc: Any, tmpfs: Path) -> None:
    r = await cc.post("/mnt/big", os.urandom(2 << 20))
    assert r.status == 507
    assert os.listdir(tmpfs) == []


async def test_read_only_target_is_409(cc: Any, tmpfs: Path) -> None:
    (tmpfs / "keep").write_bytes(b"k")
    await asyncio.to_thread(subprocess.run, ["mount", "-o", "remount,ro", str(tmpfs)],
                            check=True)
    r = await cc.post("/mnt/keep", b"new")
    assert r.status == 409
    assert "read-only" in (await r.json())["message"]
    assert (tmpfs / "keep").read_bytes() == b"k"


async def test_directory_download_is_pax_tar(cc: Any, plain: tuple[Path, Path]) -> None:
    root, outside = plain
    (outside / "secret").write_bytes(b"TOP SECRET")
    d = root / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "f").write_bytes(b"file data")
    os.link(d / "sub" / "f", d / "hard")
    os.symlink(str(outside / "secret"), d / "abs")
    os.mkfifo(d / "fifo")
    os.mknod(d / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    r = await cc.get("/d", query={"digest": "entry"})  # the report comes when asked
    assert r.status == 200 and r.headers["Content-Type"] == "application/x-tar"
    raw = await r.read()
    assert b"TOP SECRET" not in raw
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r|") as tf:
        members = {m.name: m for m in tf}
    assert members["abs"].issym() and members["abs"].linkname == str(outside / "secret")
    # Names are sent sorted: "hard" comes first and holds the data, "sub/f" links to it.
    assert members["hard"].isreg() and members["hard"].size == 9
    assert members["sub/f"].islnk() and members["sub/f"].linkname == "hard"
    assert "fifo" not in members and "null" not in members
    last = members["."]
    assert last.pax_headers["AGGAPI.complete"] == "true"
    skipped = {s["path"]: s["type"] for s in json.loads(last.pax_headers["AGGAPI.skipped"])}
    assert skipped == {"fifo": "fifo", "null": "char"}


async def test_directory_over_caps_is_413(plain: tuple[Path, Path], serve: Any,
                                          limits: CopyLimits) -> None:
    root, _ = plain
    for i in range(12):
        (root / f"f{i}").write_bytes(b"x")
    deep = root / "deep"
    for i in range(5):
        deep = deep / str(i)
    deep.mkdir(parents=True)
    cc = await serve(DirResolver(root), CopyLimits(max_entries=10, state_dir=limits.state_dir))
    assert (await cc.get("/")).status == 413
    cc = await serve(DirResolver(root), CopyLimits(max_depth=3, state_dir=limits.state_dir))
    assert (await cc.get("/deep")).status == 413


async def test_tar_upload_round_trip(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    src = root / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "f").write_bytes(os.urandom(200_000))
    os.link(src / "a" / "b" / "f", src / "a" / "h")
    os.symlink("b/f", src / "a" / "ln")
    (src / "suid").write_bytes(b"x")
    os.chmod(src / "suid", 0o4755)
    raw = await (await cc.get("/src")).read()
    r = await cc.post("/dst", raw, format="tar", sha256=hashlib.sha256(raw).hexdigest())
    assert r.status == 200, await r.text()
    assert (await r.json())["entries"] >= 5
    dst = root / "dst"
    assert (dst / "a" / "b" / "f").read_bytes() == (src / "a" / "b" / "f").read_bytes()
    assert os.stat(dst / "a" / "h").st_ino == os.stat(dst / "a" / "b" / "f").st_ino
    assert os.readlink(dst / "a" / "ln") == "b/f"
    assert stat.S_IMODE(os.stat(dst / "suid").st_mode) == 0o755
    assert temp_leftovers(root) == []


async def test_tar_checksum_mismatch_commits_nothing(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in ("x/one", "two"):
            info = tarfile.TarInfo(name)
            info.size = 3
            tf.addfile(info, io.BytesIO(b"abc"))
    (root / "dst").mkdir()
    (root / "dst" / "two").write_bytes(b"old")
    r = await cc.post("/dst", buf.getvalue(), format="tar", sha256="1" * 64)
    assert r.status == 400
    assert sorted(os.listdir(root / "dst")) == ["two"]  # x/ was created, then removed
    assert (root / "dst" / "two").read_bytes() == b"old"
    assert temp_leftovers(root) == []


async def test_symlink_download_needs_symlink_keep(cc: Any, plain: tuple[Path, Path]) -> None:
    """Issue 24 finding 8: a GET of a symlink is not the file: 409 unless symlink=keep
    (then the link itself: its stat, no body). HEAD answers the same (issue 35)."""
    root, _ = plain
    os.symlink(".ssh/id_ed25519", root / "app.conf")

    async def get(**extra: str) -> Any:
        return await cc.client.get("/v1/copy", params={"container": "c", "path": "/app.conf",
                                                       **extra},
                                   headers=cc._headers("copy.download", "/app.conf", {}, None))

    r = await get()
    assert r.status == 409
    status = await r.json()
    assert status["kind"] == "Status" and "symbolic link" in status["message"]
    assert "symlink=keep" in status["message"] and "X-Aggapi-Stat" not in r.headers
    assert (await get(symlink="follow")).status == 400
    r = await get(symlink="keep")
    assert r.status == 200 and await r.read() == b""
    doc = stat_of(r)
    assert (doc["type"], doc["linkTarget"]) == ("symlink", ".ssh/id_ed25519")
    assert (await cc.head("/app.conf")).status == 409
    r = await cc.head("/app.conf", query={"symlink": "keep"})
    assert r.status == 200 and stat_of(r)["type"] == "symlink"
