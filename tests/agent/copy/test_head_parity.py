"""Issue 35 items 5 and 7: HEAD answers exactly what GET would (status and headers,
no body); a hash covers the size seen at lookup, whatever the file does after; HEAD
holds its slot in its namespace's bucket."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy import download as dl
from aggapi.agent.copy.quotas import CopyLimits
from tests.agent.copy.conftest import DirResolver

# What a client may read off the head of a download (everything but the body's own
# framing and the server's Date).
SAME = ("Content-Length", "Content-Type", "Content-Range", "Accept-Ranges", "ETag",
        "Last-Modified", "X-Aggapi-Stat", "X-Aggapi-Sha256", "Digest", "Repr-Digest",
        "Retry-After")


def head_of(r: Any) -> dict[str, str | None]:
    return {h: r.headers.get(h) for h in SAME}


async def both(cc: Any, path: str, **kw: Any) -> tuple[Any, Any]:
    """(HEAD, GET) of ``path``; the GET's body is read (and dropped)."""
    head = await cc.head(path, **kw)
    get = await cc.get(path, **kw)
    await get.read()
    return head, get


async def test_head_and_get_agree_on_a_file(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    data = os.urandom(300_000)
    (root / "f").write_bytes(data)
    head, get = await both(cc, "/f")
    assert head.status == get.status == 200
    assert head_of(head) == head_of(get)
    assert head.headers["Content-Length"] == str(len(data))
    assert head.headers["Accept-Ranges"] == "bytes" and head.headers["ETag"]
    assert head.headers["X-Aggapi-Sha256"] == hashlib.sha256(data).hexdigest()
    # digest=trailer (what ncp asks): GET announces the trailer and counts it; so does
    # HEAD, without hashing anything.
    (root / "g").write_bytes(data)
    head, get = await both(cc, "/g", query={"digest": "trailer"})
    assert head_of(head) == head_of(get)
    assert head.headers["X-Aggapi-Sha256"] == "trailer"
    assert head.headers["Content-Length"] == str(len(data) + 32)


async def test_head_ignores_range_as_rfc9110_says(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "f").write_bytes(b"0123456789")
    head = await cc.head("/f", headers={"Range": "bytes=4-"})
    get = await cc.get("/f")
    await get.read()
    assert head.status == 200 and head_of(head) == head_of(get)


async def test_head_of_a_symlink_is_what_get_answers(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    (root / "d").mkdir()
    os.symlink("/etc/shadow", root / "d" / "ln")
    head, get = await both(cc, "/d/ln")
    assert head.status == get.status == 409
    head, get = await both(cc, "/d/ln", query={"symlink": "keep"})
    assert head.status == get.status == 200
    assert head_of(head) == head_of(get)


async def test_head_of_a_directory_is_what_get_answers(cc: Any, plain: tuple[Path, Path]
                                                       ) -> None:
    root, _ = plain
    (root / "d").mkdir()
    (root / "d" / "f").write_bytes(b"x")
    head = await cc.head("/d")
    get = await cc.get("/d")
    await get.read()
    assert head.status == get.status == 200
    assert {h: head.headers.get(h) for h in ("Content-Type", "X-Aggapi-Stat")} == \
        {h: get.headers.get(h) for h in ("Content-Type", "X-Aggapi-Stat")}


async def test_head_of_what_get_refuses_is_the_same_refusal(
        plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> None:
    root, _ = plain
    (root / "big").write_bytes(b"x" * 2048)
    (root / "tree").mkdir()
    for i in range(5):
        (root / "tree" / str(i)).write_bytes(b"y")
    lim = CopyLimits(size_limit=1024, max_entries=3, state_dir=limits.state_dir)
    cc = await serve(DirResolver(root), lim)
    for path in ("/big", "/tree", "/nothing"):
        head, get = await both(cc, path)
        assert head.status == get.status, path
    assert head.status == 404


def _changing(monkeypatch: pytest.MonkeyPatch, change: Any) -> None:
    """A file that changes (``change(fd)``) right after it is opened for reading: as a
    container process may, after the agent's lookup."""
    real = dl.open_regular

    def opened_then_changed(t: dl.Target) -> int:
        fd = real(t)
        change(t.path)
        return fd
    monkeypatch.setattr(dl, "open_regular", opened_then_changed)


async def test_a_growing_file_is_hashed_to_the_size_seen_at_lookup(
        cc: Any, plain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = plain
    data = os.urandom(300_000)
    (root / "f").write_bytes(data)

    def grow(path: str) -> None:
        with open(root / path.lstrip("/"), "ab") as f:
            f.write(os.urandom(3 << 20))
    _changing(monkeypatch, grow)
    head = await cc.head("/f")
    assert head.status == 200
    assert head.headers["Content-Length"] == str(len(data))
    assert head.headers["X-Aggapi-Sha256"] == hashlib.sha256(data).hexdigest()
    # GET sends exactly those bytes, and the digest that matches them.
    (root / "f").write_bytes(data)
    get = await cc.get("/f")
    assert await get.read() == data
    assert get.headers["X-Aggapi-Sha256"] == hashlib.sha256(data).hexdigest()


async def test_a_file_that_shrinks_before_its_hash_is_a_clear_conflict(
        cc: Any, plain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = plain
    (root / "f").write_bytes(os.urandom(300_000))

    def shrink(path: str) -> None:
        os.truncate(root / path.lstrip("/"), 1000)
    _changing(monkeypatch, shrink)
    assert (await cc.head("/f")).status == 409
    (root / "f").write_bytes(os.urandom(300_000))
    get = await cc.get("/f")
    assert get.status == 409
    assert "shrank" in (await get.json())["message"]


async def test_head_takes_its_slot_in_its_namespace(
        cc: Any, plain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = plain
    (root / "f").write_bytes(b"abc")
    seen: list[dict[str, int]] = []
    _changing(monkeypatch, lambda path: seen.append(dict(cc.state.slots.per_namespace)))
    r = await cc.head("/f", namespace="tenant-a")
    assert r.status == 200
    assert seen == [{"tenant-a": 1}]


async def test_heads_of_other_tenants_do_not_share_one_bucket(
        plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> None:
    root, _ = plain
    (root / "f").write_bytes(b"abc")
    lim = CopyLimits(copies_per_pod=4, copies_per_node=4, namespace_share=0.5,
                     state_dir=limits.state_dir)
    cc = await serve(DirResolver(root), lim)
    # Tenant a holds its whole share (2 of 4); tenant b's HEAD still gets a slot.
    with cc.state.slots.slot("pod-a1", "a"), cc.state.slots.slot("pod-a2", "a"):
        assert (await cc.head("/f", namespace="b", pod_uid="pod-b")).status == 200
        assert (await cc.head("/f", namespace="a", pod_uid="pod-a3")).status == 429


def _my_nice() -> int:
    import threading
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def test_big_hashes_run_on_the_lowest_priority_threads(cc: Any) -> None:
    """The hash threads run at nice 19 (the kernel gives other threads the CPU first);
    the copy workers keep the default."""
    assert await cc.state.hashers.run(_my_nice) == 19
    assert await cc.state.workers.run(_my_nice) == _my_nice()
