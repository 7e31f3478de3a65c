"""digest=trailer downloads (issue 27): a file is read once, hashed as it is sent, and
its whole sha256 follows its data as 32 raw bytes, which Content-Length counts; on a
206 too, so a resumed download is verified end to end."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from aggapi import wire
from aggapi.agent.copy import digests
from aggapi.client.extract import extract_dir
from aggapi.tar.entrydigest import TRAILING_ANNOUNCEMENT
from aggapi.tar.stream import TarReader
from tests.filetrees import PreadCounter, read_tree, write_tree

MiB = 1 << 20
TRAILER = {wire.PARAM_DIGEST: wire.DIGEST_TRAILER}
# Around the agent's 1 MiB read chunks, and empty.
SIZES = [0, 1, MiB - 1, MiB, MiB + 1, 2 * MiB + 12345]


def _file(root: Path, size: int) -> bytes:
    data = os.urandom(size)
    (root / "f").write_bytes(data)
    return data


@pytest.mark.parametrize("size", SIZES)
async def test_the_body_is_the_data_then_the_whole_files_sha256(
        cc: Any, plain: tuple[Path, Path], size: int) -> None:
    data = _file(plain[0], size)
    r = await cc.get("/f", query=TRAILER)
    body = await r.read()
    assert r.status == 200 and r.headers[wire.HEADER_SHA256] == wire.DIGEST_TRAILER
    assert int(r.headers["Content-Length"]) == size + 32
    assert body == data + hashlib.sha256(data).digest()
    # No digest up front: there is none before the data is read.
    assert wire.HEADER_DIGEST not in r.headers and wire.HEADER_REPR_DIGEST not in r.headers


@settings(max_examples=12, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=hs.integers(min_value=1, max_value=3 * MiB - 1))
async def test_a_resumed_range_ends_with_the_whole_files_sha256(
        cc: Any, plain: tuple[Path, Path], at: int) -> None:
    """The client has bytes [0, at) and hashes them; the trailer is of all the file."""
    path = plain[0] / "r"
    if not path.exists():
        path.write_bytes(os.urandom(3 * MiB))
    data = path.read_bytes()
    first = await cc.get("/r", query=TRAILER)
    tag = first.headers["ETag"]
    first.close()
    r = await cc.get("/r", query=TRAILER, headers={"Range": f"bytes={at}-", "If-Range": tag})
    body = await r.read()
    assert r.status == 206 and r.headers[wire.HEADER_SHA256] == wire.DIGEST_TRAILER
    assert r.headers["Content-Range"] == f"bytes {at}-{len(data) - 1}/{len(data)}"
    assert int(r.headers["Content-Length"]) == len(data) - at + 32
    assert body == data[at:] + hashlib.sha256(data).digest()


async def test_a_range_short_of_the_end_has_its_digest_up_front(
        cc: Any, plain: tuple[Path, Path]) -> None:
    """The trailer is the whole file's: a range that stops early has nowhere to put it."""
    data = _file(plain[0], 1000)
    r = await cc.get("/f", query=TRAILER, headers={"Range": "bytes=10-19"})
    assert r.status == 206 and await r.read() == data[10:20]
    assert r.headers[wire.HEADER_SHA256] == hashlib.sha256(data).hexdigest()


async def test_each_byte_is_read_once(cc: Any, plain: tuple[Path, Path],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashed as it is sent: the file is read once (today's form reads it twice)."""
    data = _file(plain[0], 5 * MiB + 7)
    read = PreadCounter(monkeypatch)
    r = await cc.get("/f", query=TRAILER)
    assert await r.read() == data + hashlib.sha256(data).digest()
    assert read.bytes == len(data)


async def test_a_digest_taken_while_sending_is_cached_for_the_next_download(
        cc: Any, plain: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Cached on the cache's own terms (a settled file, unchanged while sent); then the
    digest is known before the data, and goes up front with no read at all for it."""
    monkeypatch.setattr(digests, "SETTLE_NS", -10**12)  # every file counts as settled
    data = _file(plain[0], 2 * MiB)
    first = await cc.get("/f", query=TRAILER)
    assert first.headers[wire.HEADER_SHA256] == wire.DIGEST_TRAILER
    assert (await first.read())[-32:] == hashlib.sha256(data).digest()
    again = await cc.get("/f", query=TRAILER)
    assert again.headers[wire.HEADER_SHA256] == hashlib.sha256(data).hexdigest()
    assert await again.read() == data


@pytest.mark.parametrize("path", ["/f", "/d", "/missing"])
@pytest.mark.parametrize(("key", "value", "message"), [
    (wire.PARAM_DIGEST, "header", "digest must be trailer"),
    (wire.PARAM_SYMLINK, "follow", "symlink must be keep"),
])
async def test_an_unknown_option_is_400_whatever_the_path_holds(
        cc: Any, plain: tuple[Path, Path], path: str, key: str, value: str,
        message: str) -> None:
    """Parsed with the request's other parameters, before the container is looked at:
    a file, a directory, or nothing at all."""
    _file(plain[0], 10)
    (plain[0] / "d").mkdir()
    r = await cc.get(path, query={key: value})
    assert r.status == 400 and message in (await r.json())["message"]


async def test_a_directory_asked_with_digest_trailer_trails_each_files_sha256(
        cc: Any, plain: tuple[Path, Path], tmp_path: Path) -> None:
    """Through the real handler: the tar announces trailing digests, and the client's
    real extraction checks every file of it."""
    tree = {"big": os.urandom(2 * MiB + 3), "d/small": b"abc", "d/e/empty": b""}
    write_tree(plain[0] / "t", tree)
    r = await cc.get("/t", query=TRAILER)
    raw = await r.read()
    assert r.status == 200 and TRAILING_ANNOUNCEMENT in raw
    assert b"AGGAPI.sha256=" not in raw and raw.count(b"AGGAPI.previousSha256=") == 3
    sr = asyncio.StreamReader()
    sr.feed_data(raw)
    sr.feed_eof()
    res = await extract_dir(TarReader(sr), tmp_path / "dst")
    assert res.verified and read_tree(tmp_path / "dst") == tree
