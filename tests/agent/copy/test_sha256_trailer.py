"""sha256=trailer (issue 27: one pass over the file on the client): the body's last 32
bytes are the raw sha256 of the bytes before them, checked before anything is renamed
into place, for a raw file and for a tar."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.agent.copy.upload import Expected
from aggapi.agent.copy.uploadparams import UploadParams
from aggapi.status import StatusError
from tests.agent.copy.conftest import DirResolver, temp_leftovers
from tests.tarcraft import pax_tar

TRAILER = UploadParams(sha256_trailer=True)


def pieces_of(body: bytes, cuts: list[int]) -> Callable[[int], Awaitable[bytes]]:
    """A body read as it may arrive: pieces cut at ``cuts``, then b"" for ever."""
    bounds = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    parts = [body[a:b] for a, b in itertools.pairwise(bounds) if b > a]

    async def read(n: int) -> bytes:
        return parts.pop(0) if parts else b""

    return read


async def drain(want: Expected) -> bytes:
    out = bytearray()
    while data := await want.read(1 << 20):
        out += data
    return bytes(out)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(min_value=0), max_size=12))
async def test_the_trailer_is_split_off_wherever_the_pieces_break(
        data: bytes, cuts: list[int]) -> None:
    body = data + hashlib.sha256(data).digest()
    want = Expected(pieces_of(body, cuts), len(body), TRAILER)
    assert want.size == len(data)
    assert await drain(want) == data
    assert want.sha256 == hashlib.sha256(data).hexdigest()
    want.check(hashlib.sha256(data).hexdigest(), "/f")


@settings(max_examples=100, deadline=None, derandomize=True)
@given(data=st.binary(max_size=100), cut=st.integers(min_value=1, max_value=31))
async def test_a_body_ending_inside_its_trailer_is_refused(data: bytes, cut: int) -> None:
    body = (data + hashlib.sha256(data).digest())[:-cut]
    want = Expected(pieces_of(body, [len(data)]), len(data) + 32, TRAILER)
    assert await drain(want) == data
    with pytest.raises(StatusError, match="inside its sha256 trailer") as err:
        _ = want.sha256
    assert err.value.code == 400


@pytest.mark.parametrize("length", [None, 0, 31])
def test_a_trailer_needs_a_content_length_that_holds_it(length: int | None) -> None:
    with pytest.raises(StatusError) as err:
        Expected(pieces_of(b"", []), length, TRAILER)
    assert err.value.code == 411


async def test_a_raw_file_with_its_trailer_is_written(cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    data = os.urandom(3 * 1024 * 1024 + 5)
    r = await cc.post("/f.bin", data + hashlib.sha256(data).digest(), sha256="trailer")
    assert r.status == 200, await r.text()
    assert await r.json() == {"path": "/f.bin", "size": len(data),
                              "sha256": hashlib.sha256(data).hexdigest()}
    assert (root / "f.bin").read_bytes() == data
    assert temp_leftovers(root) == []


@pytest.mark.parametrize("flip", [0, 1 << 20, -33, -1])
async def test_any_flipped_byte_leaves_the_target_unchanged(
        cc: Any, plain: tuple[Path, Path], flip: int) -> None:
    """A byte of the data (first, inside, last) or of the trailer itself."""
    root, _ = plain
    (root / "t").write_bytes(b"original")
    data = os.urandom(2 * 1024 * 1024)
    body = bytearray(data + hashlib.sha256(data).digest())
    body[flip] ^= 0x40
    r = await cc.post("/t", bytes(body), sha256="trailer")
    assert r.status == 400
    doc = await r.json()
    assert doc["kind"] == "Status" and "sha256 mismatch" in doc["message"]
    assert (root / "t").read_bytes() == b"original"
    assert temp_leftovers(root) == []


async def test_a_tar_with_its_trailer_is_extracted_and_a_bad_one_is_not(
        cc: Any, plain: tuple[Path, Path]) -> None:
    root, _ = plain
    raw = pax_tar({"a.txt": b"alpha", "sub/b.bin": os.urandom(100_000)})
    bad = bytearray(raw + hashlib.sha256(raw).digest())
    bad[-1] ^= 1
    r = await cc.post("/bad", bytes(bad), format="tar", sha256="trailer")
    assert r.status == 400 and "sha256 mismatch" in (await r.json())["message"]
    assert not (root / "bad").exists()
    r = await cc.post("/dst", raw + hashlib.sha256(raw).digest(), format="tar",
                      sha256="trailer")
    assert r.status == 200, await r.text()
    reply = await r.json()
    assert reply["size"] == len(raw) and reply["sha256"] == hashlib.sha256(raw).hexdigest()
    assert (root / "dst/a.txt").read_bytes() == b"alpha"
    assert temp_leftovers(root) == []


async def test_a_short_body_is_refused(cc: Any, plain: tuple[Path, Path]) -> None:
    r = await cc.post("/f", b"x" * 31, sha256="trailer")
    assert r.status == 411
    assert not (plain[0] / "f").exists()


async def test_the_size_limit_counts_the_data_not_the_trailer(
        plain: tuple[Path, Path], serve: Any, limits: CopyLimits) -> None:
    """A file of exactly the limit goes, with its trailer past the limit; one byte more
    does not."""
    cc = await serve(DirResolver(plain[0]), CopyLimits(size_limit=1 << 20,
                                                       state_dir=limits.state_dir))
    for size, status in ((1 << 20, 200), ((1 << 20) + 1, 413)):
        data = os.urandom(size)
        r = await cc.post("/f", data + hashlib.sha256(data).digest(), sha256="trailer")
        assert r.status == status, await r.text()
    assert (plain[0] / "f").stat().st_size == 1 << 20
