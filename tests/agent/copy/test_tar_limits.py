"""Hostile tar uploads over HTTP (issue 13, findings 3, 5 and 6): bounded metadata,
every entry counted, sparse entries refused, out-of-range numbers a 400, parsing off the
event loop, memory independent of the upload's size; the target is left untouched."""

from __future__ import annotations

import threading
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.tar import parse as tarparse
from tests import tarcraft as tc
from tests.agent.copy.conftest import snapshot, temp_leftovers


@pytest.fixture
def dst(plain: tuple[Path, Path]) -> Path:
    d = plain[0] / "dst"
    d.mkdir()
    (d / "keep").write_bytes(b"old")
    return d


async def refused(cc: Any, root: Path, dst: Path, body: bytes, code: int = 400) -> str:
    """POST ``body`` as a tar to /dst; assert ``code`` and that nothing changed."""
    before = snapshot(dst)
    r = await cc.post("/dst", body, format="tar")
    text: str = await r.text()
    assert r.status == code, text
    assert snapshot(dst) == before
    assert temp_leftovers(root) == []
    return text


async def test_global_pax_flood_is_refused(cc: Any, plain: tuple[Path, Path],
                                           dst: Path) -> None:
    # A file first (its temp must go), then global headers that each add a key.
    body = tc.entry(b"new", b"x" * 5000) + b"".join(
        tc.pax([(b"k%d" % i, b"v" * 100)], b"g") + tc.entry(b"./", typeflag=b"5")
        for i in range(300)) + tc.ZERO2
    text = await refused(cc, plain[0], dst, body)
    assert "global PAX" in text


async def test_dot_entries_count_against_the_entry_limit(cc: Any, plain: tuple[Path, Path],
                                                         dst: Path,
                                                         limits: CopyLimits) -> None:
    body = b"".join(tc.entry(b"./", typeflag=b"5")
                    for _ in range(limits.max_entries + 1)) + tc.ZERO2
    text = await refused(cc, plain[0], dst, body, 413)
    assert f"more than {limits.max_entries} entries" in text


@pytest.mark.skipif(not tc.gnu_tar_available(), reason="needs GNU tar")
@pytest.mark.parametrize("fmt", sorted(tc.SPARSE_FORMATS))
async def test_sparse_entries_are_refused(cc: Any, plain: tuple[Path, Path], dst: Path,
                                          tmp_path: Path, fmt: str,
                                          limits: CopyLimits) -> None:
    for size in (3 << 20, limits.size_limit + (1 << 30)):  # under and over the size limit
        work = tmp_path / str(size)
        work.mkdir()
        body = tc.gnu_sparse_tar(work, fmt, size)
        text = await refused(cc, plain[0], dst, body)
        assert "sparse tar entries are not supported" in text


@pytest.mark.parametrize(("key", "value"), [
    (b"mtime", b"1" + b"0" * 30), (b"mtime", b"1e400"), (b"mtime", b"nan"),
    (b"mtime", b"-99999999999"), (b"size", b"-1"), (b"uid", b"99999999999"),
    (b"gid", b"inf")])
async def test_out_of_range_pax_numbers_are_400(cc: Any, plain: tuple[Path, Path], dst: Path,
                                                key: bytes, value: bytes) -> None:
    body = tc.pax([(key, value)]) + tc.entry(b"new", b"data") + tc.ZERO2
    text = await refused(cc, plain[0], dst, body)
    assert "invalid tar" in text


@pytest.mark.parametrize(("field", "raw"), [
    ("mtime", b"\x80" + b"\x7f" * 11), ("size", b"\xff" * 12), ("uid", b"\xff" * 8),
    ("mode", b"\x80" + b"\xff" * 7), ("devmajor", b"\x80\x01" + b"\0" * 6),
    ("typeflag", b"\xe9")])
async def test_out_of_range_header_fields_are_400(cc: Any, plain: tuple[Path, Path],
                                                  dst: Path, field: str, raw: bytes) -> None:
    body = tc.entry(b"ok", b"1") + tc.block(b"new", fields={field: raw}) + tc.ZERO2
    await refused(cc, plain[0], dst, body)


async def test_refusal_after_file_data_leaves_nothing(cc: Any, plain: tuple[Path, Path],
                                                      dst: Path) -> None:
    bad = bytearray(tc.block(b"second"))
    bad[0] ^= 1  # checksum mismatch
    body = tc.entry(b"first", b"y" * (3 << 20)) + bytes(bad) + tc.ZERO2
    text = await refused(cc, plain[0], dst, body)
    assert "checksum" in text


@pytest.fixture
def feed_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    seen: list[int] = []
    real = tarparse.TarParser.feed

    def spy(self: tarparse.TarParser, data: bytes, start: int = 0) -> Iterator[tarparse.Event]:
        seen.append(threading.get_ident())
        return real(self, data, start)

    monkeypatch.setattr(tarparse.TarParser, "feed", spy)
    yield seen


async def test_tar_is_parsed_off_the_event_loop(cc: Any, plain: tuple[Path, Path],
                                                feed_threads: list[int]) -> None:
    body = b"".join(tc.entry(b"f%d" % i, b"z" * 700) for i in range(50)) + tc.ZERO2
    r = await cc.post("/dst", body, format="tar")
    assert r.status == 200, await r.text()
    assert (plain[0] / "dst" / "f49").read_bytes() == b"z" * 700
    assert feed_threads and threading.get_ident() not in feed_threads


async def stream_tar(file_mib: int, small: int) -> AsyncIterator[bytes]:
    yield tc.block(b"big", size=file_mib << 20)
    piece = b"q" * (256 << 10)
    for _ in range(file_mib * 4):
        yield piece
    for i in range(small):
        yield tc.entry(b"s%d" % i, b"s" * 100)
    yield tc.ZERO2


async def test_upload_memory_does_not_grow_with_its_size(cc: Any,
                                                         plain: tuple[Path, Path]) -> None:
    peaks = []
    for mib in (4, 40):
        tracemalloc.start()
        try:
            r = await cc.post(f"/d{mib}", stream_tar(mib, 200), format="tar")
            assert r.status == 200, await r.text()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert (plain[0] / f"d{mib}" / "big").stat().st_size == mib << 20
    # Ten times the bytes, about the same memory (a few MiB of batches in flight).
    assert peaks[1] < peaks[0] + (4 << 20), peaks
    assert peaks[1] < 16 << 20, peaks


@pytest.mark.parametrize("value", [b"9223372036.854775807", b"-9223372036.854775808",
                                   b"-1.5", b"0"])
async def test_extreme_but_valid_mtimes_are_accepted(cc: Any, plain: tuple[Path, Path],
                                                     value: bytes) -> None:
    body = tc.pax([(b"mtime", value)]) + tc.entry(b"f", b"data") + tc.ZERO2
    r = await cc.post("/dst", body, format="tar")
    assert r.status == 200, await r.text()
    assert (plain[0] / "dst" / "f").read_bytes() == b"data"


async def test_parents_made_for_an_entry_count_as_metadata_operations(
        cc: Any, plain: tuple[Path, Path], dst: Path, limits: CopyLimits) -> None:
    """Issue 24, finding 5: each entry 'dN/x1/.../x14/f' makes 15 directories (mkdir -p).
    100 of them are 100 entries but 1,600 metadata operations: over a limit of 1,000,
    refused with 413 at the entry that passes it, nothing left behind."""
    deep = "/".join(f"x{i}" for i in range(1, limits.max_depth - 1))
    body = b"".join(tc.entry(f"d{n}/{deep}/f".encode(), b"z")
                    for n in range(100)) + tc.ZERO2
    assert len(body) < 200 * 1024
    text = await refused(cc, plain[0], dst, body, 413)
    assert f"more than {limits.max_entries} metadata operations" in text


async def test_a_tar_listing_its_directories_costs_one_operation_per_entry(
        cc: Any, plain: tuple[Path, Path], dst: Path, limits: CopyLimits) -> None:
    # The same tree as tar -c writes it (parents first): 16 + 100 * 2 entries, accepted.
    deep = "/".join(f"x{i}" for i in range(1, limits.max_depth - 1))
    parts = deep.split("/")
    body = b"".join(tc.entry(f"d0/{'/'.join(parts[:i])}/".encode().replace(b"//", b"/"),
                             typeflag=b"5") for i in range(len(parts) + 1))
    body += b"".join(tc.entry(f"d0/{deep}/f{n}".encode(), b"z") for n in range(200))
    r = await cc.post("/dst", body + tc.ZERO2, format="tar")
    assert r.status == 200, await r.text()
    assert (dst / "d0" / deep / "f199").read_bytes() == b"z"
