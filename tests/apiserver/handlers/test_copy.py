"""pods/copy end to end: front proxy -> apiserver -> real agent -> a real runc container
started through CRI with kubelet's labels."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import tarfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.client import packtar
from aggapi.client.extract import extract_dir
from aggapi.tar.stream import TarReader
from tests.filetrees import data_spans, pax_records, read_tree, write_tree
from tests.framework.pods import ContainerSpec, PodRunner, RunningPod

from .conftest import Stack, pod_object

GiB = 1 << 30
DIGEST_HEADERS = ("X-Aggapi-Sha256", "Digest", "Repr-Digest")


async def _run(stack: Stack, pods: PodRunner, image: str, name: str = "box",
               command: tuple[str, ...] = ()) -> RunningPod:
    running = await pods.run_pod(name, [ContainerSpec("app", image, command=command)])
    stack.kube.put("api/v1", "pods", pod_object(name, [("app", image)], uid=running.uid))
    return running


@pytest.fixture
async def box(stack: Stack, pods: PodRunner, busybox_image: str) -> RunningPod:
    return await _run(stack, pods, busybox_image)


def _stat(headers: Any) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(base64.b64decode(headers["X-Aggapi-Stat"]))
    return result


async def test_file_round_trip_with_stat_and_digest(stack: Stack, box: RunningPod) -> None:
    data = os.urandom(3 << 20)
    digest = hashlib.sha256(data).hexdigest()
    path = stack.pod_path("box", "copy")
    s = stack.session()
    # kubectl create --raw -f FILE sends no Content-Type: neither do we.
    async with s.post(path, params={"container": "app", "path": "/tmp/blob",
                                    "sha256": digest, "mode": "0640"},
                      data=data, skip_auto_headers=["Content-Type"]) as resp:
        assert resp.status in (200, 201), await resp.text()
        reply = await resp.json()
    assert reply["path"] == "/tmp/blob" and reply["size"] == len(data)
    assert reply["sha256"] == digest
    async with s.get(path, params={"container": "app", "path": "/tmp/blob"}) as resp:
        assert resp.status == 200
        assert int(resp.headers["Content-Length"]) == len(data)
        assert resp.headers["X-Aggapi-Sha256"] == digest
        assert await resp.read() == data
        got_digests = {h: resp.headers[h] for h in DIGEST_HEADERS}
    async with s.head(path, params={"container": "app", "path": "/tmp/blob"}) as resp:
        assert resp.status == 200
        st = _stat(resp.headers)
        # HEAD relays the same digests as GET, so a client can check before fetching.
        assert {h: resp.headers.get(h) for h in DIGEST_HEADERS} == got_digests
    assert st["size"] == len(data) and st["type"] == "file" and st["mode"] & 0o777 == 0o640


async def _stream(n: int, chunk: int = 1 << 20) -> AsyncIterator[bytes]:
    block = os.urandom(chunk)
    for i in range(n // chunk):
        # Vary each block cheaply so a stuck or repeated chunk changes the digest.
        yield i.to_bytes(8, "big") + block[8:]


async def test_one_gib_round_trip_on_the_watch_path(stack: Stack, box: RunningPod) -> None:
    """The long-transfer path (/watch/ prefix: long-running in kube-apiserver)."""
    want = hashlib.sha256()
    async def body() -> AsyncIterator[bytes]:
        async for b in _stream(GiB):
            want.update(b)
            yield b

    path = stack.pod_path("box", "copy", watch=True)
    s = stack.session()
    async with s.post(path, params={"container": "app", "path": "/tmp/big"},
                      data=body(), headers={"Content-Length": str(GiB)}) as resp:
        assert resp.status in (200, 201), await resp.text()
        reply = await resp.json()
    assert reply["size"] == GiB and reply["sha256"] == want.hexdigest()
    got, n = hashlib.sha256(), 0
    async with s.get(path, params={"container": "app", "path": "/tmp/big"}) as resp:
        assert resp.status == 200
        assert resp.headers["X-Aggapi-Sha256"] == want.hexdigest()
        async for chunk in resp.content.iter_chunked(1 << 20):
            got.update(chunk)
            n += len(chunk)
    assert n == GiB and got.hexdigest() == want.hexdigest()


async def test_range_resume(stack: Stack, box: RunningPod) -> None:
    data = os.urandom(1 << 20)
    path = stack.pod_path("box", "copy")
    s = stack.session()
    async with s.post(path, params={"container": "app", "path": "/tmp/r"}, data=data) as resp:
        assert resp.status in (200, 201)
    async with s.get(path, params={"container": "app", "path": "/tmp/r"},
                     headers={"Range": "bytes=1000-"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
        assert resp.headers["X-Aggapi-Sha256"] == hashlib.sha256(data).hexdigest()
        assert await resp.read() == data[1000:]


async def test_directory_round_trip_keeps_modes_and_links(stack: Stack, box: RunningPod
                                                          ) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, mode, content in (("a.txt", 0o600, b"alpha"), ("sub/b.sh", 0o755, b"#!")):
            info = tarfile.TarInfo(name)
            info.mode, info.size = mode, len(content)
            tar.addfile(info, io.BytesIO(content))
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        tar.addfile(link)
        hard = tarfile.TarInfo("hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "a.txt"
        tar.addfile(hard)
    path = stack.pod_path("box", "copy")
    s = stack.session()
    async with s.post(path, params={"container": "app", "path": "/tmp/tree",
                                    "format": "tar"}, data=buf.getvalue()) as resp:
        assert resp.status in (200, 201), await resp.text()
    async with s.get(path, params={"container": "app", "path": "/tmp/tree"}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("application/x-tar")
        raw = await resp.read()
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = {m.name.rstrip("/"): m for m in tar.getmembers()}
        assert members["a.txt"].mode & 0o777 == 0o600
        assert members["sub/b.sh"].mode & 0o777 == 0o755
        assert members["link"].issym() and members["link"].linkname == "a.txt"
        hard = members["hard"]
        assert hard.islnk() or members["a.txt"].islnk()  # one name links to the other
        f = tar.extractfile(members["sub/b.sh"])
        assert f is not None and f.read() == b"#!"


async def test_every_copy_also_needs_pods_exec(stack: Stack, box: RunningPod) -> None:
    def policy(spec: dict[str, Any]) -> Any:
        ra = spec.get("resourceAttributes") or {}
        if ra.get("subresource") == "exec":
            return False, "no exec for you"
        return True

    stack.kube.sar_policy = policy
    path = stack.pod_path("box", "copy")
    s = stack.session()
    async with s.post(path, params={"container": "app", "path": "/tmp/x"}, data=b"x") as resp:
        assert resp.status == 403
        body = await resp.json()
    assert body["kind"] == "Status" and "pods/exec" in body["message"]
    # Reading too: a container's files hold its Secrets and ServiceAccount tokens.
    async with s.get(path, params={"container": "app", "path": "/etc/passwd"}) as resp:
        assert resp.status == 403
        assert "pods/exec" in (await resp.json())["message"]
    async with s.head(path, params={"container": "app", "path": "/etc/passwd"}) as resp:
        assert resp.status == 403 and "X-Aggapi-Stat" not in resp.headers


async def test_watch_path_still_checks_the_operation_verb(stack: Stack, box: RunningPod
                                                          ) -> None:
    """RBAC 'watch' on pods/copy (the /watch/ path) does not by itself allow uploads."""
    def policy(spec: dict[str, Any]) -> Any:
        ra = spec.get("resourceAttributes") or {}
        return ra.get("verb") == "watch" or ra.get("subresource") == "exec"

    stack.kube.sar_policy = policy
    path = stack.pod_path("box", "copy", watch=True)
    async with stack.session().post(path, params={"container": "app", "path": "/tmp/y"},
                                    data=b"y") as resp:
        assert resp.status == 403
        assert 'cannot create resource "pods/copy"' in (await resp.json())["message"]


async def test_checksum_mismatch_leaves_target_unchanged(stack: Stack, box: RunningPod
                                                         ) -> None:
    path = stack.pod_path("box", "copy")
    s = stack.session()
    q = {"container": "app", "path": "/tmp/keep"}
    async with s.post(path, params=q, data=b"original") as resp:
        assert resp.status in (200, 201)
    async with s.post(path, params={**q, "sha256": "0" * 64}, data=b"replacement") as resp:
        assert resp.status >= 400
        assert (await resp.json())["kind"] == "Status"
    async with s.get(path, params=q) as resp:
        assert await resp.read() == b"original"


async def test_errors_are_relayed_as_status(stack: Stack, box: RunningPod) -> None:
    path = stack.pod_path("box", "copy")
    s = stack.session()
    cases = [({"container": "app", "path": "/no/such/file"}, 404),
             ({"container": "app", "path": "relative/path"}, 404),  # from the cwd
             ({"container": "ghost", "path": "/etc/passwd"}, 400),
             ({"container": "app"}, 400)]
    for params, code in cases:
        async with s.get(path, params=params) as resp:
            assert resp.status == code, (params, await resp.text())
            assert (await resp.json())["kind"] == "Status"
    async with s.get(stack.pod_path("nobody", "copy"),
                     params={"container": "app", "path": "/etc/passwd"}) as resp:
        assert resp.status == 404


async def test_copy_into_a_container_without_shell_or_tar(
        stack: Stack, pods: PodRunner, noshell_image: str) -> None:
    """What kubectl cp cannot do: the image has no /bin/sh and no tar."""
    await _run(stack, pods, noshell_image, name="distroless", command=("/sleep", "3600"))
    path = stack.pod_path("distroless", "copy")
    s = stack.session()
    q = {"container": "app", "path": "/config.json"}
    async with s.post(path, params=q, data=b'{"ok": true}') as resp:
        assert resp.status in (200, 201), await resp.text()
    async with s.get(path, params=q) as resp:
        assert await resp.read() == b'{"ok": true}'


async def test_stopped_container_is_409(stack: Stack, pods: PodRunner, busybox_image: str,
                                        cri: Any) -> None:
    running = await _run(stack, pods, busybox_image, name="stopped")
    await cri.stop_container(running.containers["app"], grace=0)
    async with stack.session().get(stack.pod_path("stopped", "copy"),
                                   params={"container": "app", "path": "/etc/passwd"}) as resp:
        assert resp.status == 409
        assert (await resp.json())["reason"] == "Conflict"


async def test_directory_copies_check_each_files_sha256(stack: Stack, box: RunningPod,
                                                        tmp_path: Path) -> None:
    """Issue 27 item 4 through the real agent: ncp's tar carries every file's sha256,
    which the agent checks before any rename (a corrupted file fails the upload, naming
    it, even when the whole tar's sha256 parameter matches the corrupted bytes), and the
    agent's download tar carries them for the client's check."""
    tree = {"a/one": b"1" * 5000, "a/b/two": os.urandom(3 << 20), "three": b""}
    write_tree(tmp_path / "src", tree)
    write_tree(tmp_path / "old", {"keep": b"old"})

    async def pack(src: Path) -> bytes:
        listing = packtar.list_tree(src)
        return b"".join([c async for c in packtar.tar_stream(src, listing)])

    good, old = await pack(tmp_path / "src"), await pack(tmp_path / "old")
    off = next(o for n, o, _ in data_spans(good) if n == "a/b/two")
    bad = bytearray(good)
    bad[off + 12345] ^= 1
    path = stack.pod_path("box", "copy")
    s = stack.session()
    q = {"container": "app", "path": "/tmp/dtree", "format": "tar"}
    async with s.post(path, params={**q, "sha256": hashlib.sha256(old).hexdigest()},
                      data=old) as resp:
        assert resp.status == 200, await resp.text()
    async with s.post(path, params={**q, "sha256": hashlib.sha256(bad).hexdigest()},
                      data=bytes(bad)) as resp:
        assert resp.status == 400
        status = await resp.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    assert "/tmp/dtree/a/b/two: sha256 mismatch" in status["message"]
    async with s.get(path, params={"container": "app", "path": "/tmp/dtree",
                                   "digest": "entry"}) as resp:  # the records, asked
        assert sorted(pax_records(await resp.read())) == [".", "keep"]  # unchanged

    async with s.post(path, params={**q, "sha256": hashlib.sha256(good).hexdigest()},
                      data=good) as resp:
        assert resp.status == 200, await resp.text()
    async with s.get(path, params={"container": "app", "path": "/tmp/dtree",
                                   "digest": "entry"}) as resp:  # the records, asked
        raw = await resp.read()
    recs = pax_records(raw)
    for rel, data in tree.items():
        assert recs[rel]["AGGAPI.sha256"] == hashlib.sha256(data).hexdigest()
        assert recs[rel]["AGGAPI.entryDigests"] == "sha256"
    sr = asyncio.StreamReader()
    sr.feed_data(raw)
    sr.feed_eof()
    res = await extract_dir(TarReader(sr), tmp_path / "back")
    assert res.verified and read_tree(tmp_path / "back") == {**tree, "keep": b"old"}


# --- issue 35: HEAD as GET, 416's Content-Range, relative paths as the kernel walks them --


def _tar(entries: list[tuple[str, bytes | str]]) -> bytes:
    """A tar of files (bytes) and symlinks (str: the target), directories implied."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, what in entries:
            info = tarfile.TarInfo(name)
            if isinstance(what, str):
                info.type, info.linkname = tarfile.SYMTYPE, what
                tar.addfile(info)
            else:
                info.size = len(what)
                tar.addfile(info, io.BytesIO(what))
    return buf.getvalue()


async def test_head_answers_what_get_answers_through_the_relay(stack: Stack, box: RunningPod
                                                               ) -> None:
    path = stack.pod_path("box", "copy")
    s = stack.session()
    async with s.post(path, params={"container": "app", "path": "/tmp/hg", "format": "tar"},
                      data=_tar([("f", b"x" * 5000), ("ln", "f")])) as resp:
        assert resp.status in (200, 201), await resp.text()
    same = ("Content-Length", "ETag", "Accept-Ranges", "X-Aggapi-Stat", *DIGEST_HEADERS)
    for p, extra, code in (("/tmp/hg/f", {}, 200), ("/tmp/hg/ln", {}, 409),
                           ("/tmp/hg/ln", {"symlink": "keep"}, 200)):
        q = {"container": "app", "path": p, **extra}
        async with s.get(path, params=q) as get:
            await get.read()
        async with s.head(path, params=q) as head:
            assert (head.status, get.status) == (code, code), p
            if code == 200:
                assert {h: head.headers.get(h) for h in same} == \
                    {h: get.headers.get(h) for h in same}, p
    assert head.headers["Content-Length"] == "0"


async def test_416_keeps_its_content_range_through_the_relay(stack: Stack, box: RunningPod
                                                             ) -> None:
    path = stack.pod_path("box", "copy")
    s = stack.session()
    q = {"container": "app", "path": "/tmp/r416"}
    async with s.post(path, params=q, data=b"y" * 1000) as resp:
        assert resp.status in (200, 201)
    async with s.get(path, params=q, headers={"Range": "bytes=5000-"}) as resp:
        assert resp.status == 416
        assert resp.headers["Content-Range"] == "bytes */1000"
        assert (await resp.json())["kind"] == "Status"


async def test_a_relative_path_through_a_symlink_is_the_kernels(
        stack: Stack, box: RunningPod, tmp_path: Path) -> None:
    tree = _tar([("dir/f", b"textual"), ("other/sub/x", b""), ("other/f", b"kernel"),
                 ("dir/link", "../other/sub")])
    path = stack.pod_path("box", "copy")
    s = stack.session()
    async with s.post(path, params={"container": "app", "path": "/tmp/rel", "format": "tar"},
                      data=tree) as resp:
        assert resp.status in (200, 201), await resp.text()
    # What the kernel opens for the same path in the same tree, here.
    with tarfile.open(fileobj=io.BytesIO(tree)) as t:
        t.extractall(tmp_path / "tmp" / "rel", filter="tar")
    want = (tmp_path / "tmp" / "rel" / "dir" / "link" / ".." / "f").read_bytes()
    # The container's cwd is /: relative paths start there.
    async with s.get(path, params={"container": "app",
                                   "path": "tmp/rel/dir/link/../f"}) as resp:
        assert resp.status == 200, await resp.text()
        assert await resp.read() == want == b"kernel"
