"""The headers digest of a tar upload (issue 27: each file's data hashed once): with
sha256=headers-trailer or sha256=headers:<hex>, the whole tar's check covers every byte
but the data of the files checked against their own AGGAPI.sha256 records. Any byte
changed, wherever it is (a header, a file's data, padding, the end blocks), is refused
and nothing is placed. The digest is worked out independently by the tarfile oracle
(tests.tarcraft.headers_digest); the tar comes from the real client writer (packtar),
and goes through the real handlers or the real TarSink and TarExtractor."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi import wire
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.client import packtar
from aggapi.status import StatusError
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from aggapi.tar.parse import TarError
from tests.agent.copy.conftest import extract_tar, snapshot, temp_leftovers
from tests.filetrees import read_tree, trees, write_tree
from tests.tarcraft import headers_digest, pax_tar

PROPS = settings(max_examples=60, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


async def apack(src: Path) -> tuple[bytes, str]:
    """ncp's upload tar of ``src`` and the headers digest the client hashed as it built it."""
    h = hashlib.sha256()
    listing = packtar.list_tree(src)
    raw = b"".join([c async for c in packtar.tar_stream(src, listing, hasher=h,
                                                        headers_only=True)])
    return raw, h.hexdigest()


def pack(src: Path) -> tuple[bytes, str]:
    return asyncio.run(apack(src))


@PROPS
@given(trees(), st.none() | st.tuples(st.integers(min_value=0), st.integers(1, 255)),
       st.sampled_from([512, 700, 1 << 20]))
def test_the_headers_digest_accepts_exactly_the_unmodified_stream(
        tree: dict[str, bytes], flip: tuple[int, int] | None, chunk: int) -> None:
    """Any tree, any one byte changed anywhere in its tar (or none): accepted exactly
    when unchanged, and a refusal leaves the target as it was. The client's digest is
    the oracle's."""
    tmp = Path(tempfile.mkdtemp(prefix="hdrdigest-"))
    try:
        (tmp / "root" / "dst").mkdir(parents=True)
        (tmp / "root" / "dst" / "keep").write_bytes(b"old")
        write_tree(tmp / "src", tree)
        raw, claim = pack(tmp / "src")
        assert claim == headers_digest(raw)
        body = bytearray(raw)
        if flip is not None:
            body[flip[0] % len(body)] ^= flip[1]
        before = snapshot(tmp / "root" / "dst")
        try:
            extract_tar(tmp / "root", bytes(body), CopyLimits(state_dir=str(tmp / "state")),
                        chunk=chunk, headers_digest=claim)
            accepted = True
        except (StatusError, TarError):
            accepted = False
        assert accepted == (flip is None)
        if accepted:
            assert read_tree(tmp / "root" / "dst") == {**tree, "keep": b"old"}
        else:
            assert snapshot(tmp / "root" / "dst") == before
        assert temp_leftovers(tmp / "root") == []
    finally:
        shutil.rmtree(tmp)


async def _tree_tar(src: Path) -> tuple[bytes, str]:
    write_tree(src, {"a.txt": b"alpha", "sub/b.bin": os.urandom(100_000),
                     "sub/c": os.urandom(1000)})
    return await apack(src)


def _members(raw: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        return {m.name: m for m in tf}


def _new_mode(raw: bytearray, name: str) -> None:
    """Another mode in ``name``'s ustar header, its checksum made right again: only the
    headers digest can tell."""
    at = _members(bytes(raw))[name].offset_data - ts.BLOCK
    blk = bytearray(raw[at:at + ts.BLOCK])
    blk[100:108] = b"0000600\0"
    blk[148:156] = b" " * 8
    blk[148:156] = b"%06o\0 " % sum(blk)
    raw[at:at + ts.BLOCK] = blk


def _flip(raw: bytearray, at: int) -> None:
    raw[at] ^= 0x40


def _padding(raw: bytearray, name: str) -> int:
    m = _members(bytes(raw))[name]
    assert m.size % ts.BLOCK
    return m.offset_data + m.size + 3


FLIPS: dict[str, Any] = {
    "header": lambda raw: _new_mode(raw, "sub/c"),
    "digest record": lambda raw: _flip(raw, raw.index(b"AGGAPI.sha256=") + 20),
    "announcement": lambda raw: _flip(raw, raw.index(b"entryDigests=") - 2),
    "file data": lambda raw: _flip(raw, _members(bytes(raw))["sub/b.bin"].offset_data + 7),
    "padding": lambda raw: _flip(raw, _padding(raw, "sub/c")),
    "first end block": lambda raw: _flip(raw, len(raw) - 2 * ts.BLOCK + 9),
    "second end block": lambda raw: _flip(raw, len(raw) - 1),
}


@pytest.mark.parametrize("where", list(FLIPS))
@pytest.mark.parametrize("form", ["trailer", "up front"])
async def test_a_changed_byte_anywhere_is_refused_and_nothing_is_placed(
        cc: Any, plain: tuple[Path, Path], where: str, form: str) -> None:
    root, outside = plain
    raw, claim = await _tree_tar(outside / "src")
    bad = bytearray(raw)
    FLIPS[where](bad)
    assert bytes(bad) != raw
    (root / "dst").mkdir()
    (root / "dst" / "keep").write_bytes(b"old")
    before = snapshot(root / "dst")
    if form == "trailer":
        r = await cc.post("/dst", bytes(bad) + bytes.fromhex(claim), format="tar",
                          sha256=wire.SHA256_HEADERS_TRAILER)
    else:
        r = await cc.post("/dst", bytes(bad), format="tar",
                          sha256=wire.SHA256_HEADERS_PREFIX + claim)
    doc = await r.json()
    assert r.status == 400, doc
    assert "sha256 mismatch" in doc["message"] or "invalid tar" in doc["message"], doc
    if where == "file data":
        assert "/dst/sub/b.bin: sha256 mismatch" in doc["message"]
    assert snapshot(root / "dst") == before
    assert temp_leftovers(root) == []
    # The same upload unchanged goes through.
    r = await cc.post("/dst", raw, format="tar", sha256=wire.SHA256_HEADERS_PREFIX + claim)
    assert r.status == 200, await r.text()
    assert (await r.json())["sha256"] == claim
    assert (root / "dst" / "sub" / "b.bin").read_bytes() == \
        (outside / "src" / "sub" / "b.bin").read_bytes()


@pytest.mark.parametrize("form", ["trailer", "up front"])
async def test_a_tree_under_its_headers_digest_is_placed(
        cc: Any, plain: tuple[Path, Path], form: str) -> None:
    root, outside = plain
    raw, claim = await _tree_tar(outside / "src")
    assert claim == headers_digest(raw) != hashlib.sha256(raw).hexdigest()
    if form == "trailer":
        r = await cc.post("/dst", raw + bytes.fromhex(claim), format="tar",
                          sha256=wire.SHA256_HEADERS_TRAILER)
    else:
        r = await cc.post("/dst", raw, format="tar", sha256=wire.SHA256_HEADERS_PREFIX + claim)
    assert r.status == 200, await r.text()
    assert await r.json() == {"path": "/dst", "size": len(raw), "sha256": claim,
                              "entries": 4}
    assert read_tree(root / "dst") == read_tree(outside / "src")
    assert temp_leftovers(root) == []


async def test_an_announced_file_without_its_record_is_refused(
        cc: Any, plain: tuple[Path, Path]) -> None:
    """Its data would be in no digest at all: refused, whatever the headers digest."""
    root, _ = plain
    ok = b"abc"
    raw = (ANNOUNCEMENT
           + ts.header("ok", ts.REG, size=3, records=record(hashlib.sha256(ok).hexdigest()))
           + ok + ts.pad(3) + ts.header("bare", ts.REG, size=3) + b"xyz" + ts.pad(3)
           + ts.END)
    r = await cc.post("/dst", raw, format="tar",
                      sha256=wire.SHA256_HEADERS_PREFIX + headers_digest(raw))
    doc = await r.json()
    assert r.status == 400
    assert "tar entry 'bare' carries no AGGAPI.sha256 record" in doc["message"]
    assert not (root / "dst").exists()
    assert temp_leftovers(root) == []


async def test_files_without_records_count_in_the_headers_digest(
        cc: Any, plain: tuple[Path, Path]) -> None:
    """An unannounced tar (another writer's): no file is checked on its own, so all of
    its data is in the headers digest, and a changed byte of it is refused."""
    root, _ = plain
    raw = pax_tar({"a": b"alpha", "b": os.urandom(3000)})
    claim = headers_digest(raw)
    assert claim == hashlib.sha256(raw).hexdigest()  # nothing left out
    bad = bytearray(raw)
    bad[_members(raw)["b"].offset_data] ^= 1
    r = await cc.post("/bad", bytes(bad), format="tar", sha256=wire.SHA256_HEADERS_PREFIX + claim)
    assert r.status == 400 and "sha256 mismatch" in (await r.json())["message"]
    assert not (root / "bad").exists()
    r = await cc.post("/dst", raw, format="tar", sha256=wire.SHA256_HEADERS_PREFIX + claim)
    assert r.status == 200, await r.text()
    assert (root / "dst" / "a").read_bytes() == b"alpha"


@pytest.mark.parametrize(("query", "why"), [
    ({"sha256": "headers-trailer"}, "applies to format=tar only"),
    ({"sha256": "headers:" + "0" * 64}, "applies to format=tar only"),
    ({"sha256": "headers:abc", "format": "tar"}, wire.SHA256_REFUSED),
    ({"sha256": "headers:trailer", "format": "tar"}, wire.SHA256_REFUSED),
    ({"sha256": "headers", "format": "tar"}, wire.SHA256_REFUSED),
])
async def test_a_malformed_headers_claim_is_refused_before_anything_is_written(
        cc: Any, plain: tuple[Path, Path], query: dict[str, str], why: str) -> None:
    """Refused up front, in words an older client's fallback recognises too."""
    r = await cc.post("/dst", b"x" * 2048, **query)
    doc = await r.json()
    assert r.status == 400 and why in doc["message"], doc
    assert not (plain[0] / "dst").exists()
