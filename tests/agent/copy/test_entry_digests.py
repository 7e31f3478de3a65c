"""Tar uploads checked file by file (issue 27 item 4): ncp's tar carries each regular
file's sha256 as the PAX record AGGAPI.sha256, and the agent checks it before the file
is renamed into place. Fed through the real client writer (packtar) into the real
TarSink and TarExtractor on a real directory, as upload_tar runs them."""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy.quotas import CopyLimits
from aggapi.client import packtar
from aggapi.status import StatusError
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import ANNOUNCEMENT, record
from aggapi.tar.parse import TarError
from tests.agent.copy.conftest import extract_tar, snapshot, temp_leftovers
from tests.filetrees import data_spans, pax_records, read_tree, trees, write_tree

PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def pack(src: Path, read_whole: int) -> bytes:
    """ncp's upload tar of ``src``; files above ``read_whole`` bytes take the two-read path."""
    saved, packtar.READ_WHOLE = packtar.READ_WHOLE, read_whole

    async def collect() -> bytes:
        listing = packtar.list_tree(src)
        raw = b"".join([c async for c in packtar.tar_stream(src, listing)])
        assert len(raw) == packtar.tar_size(src, listing)
        return raw

    try:
        return asyncio.run(collect())
    finally:
        packtar.READ_WHOLE = saved


def extract(root_dir: Path, raw: bytes, chunk: int = 1 << 20) -> None:
    """Extract ``raw`` into ``root_dir``/dst as upload_tar does; raises its refusal."""
    extract_tar(root_dir, raw, CopyLimits(state_dir=str(root_dir.parent / "state")),
                chunk=chunk)


@pytest.fixture
def box() -> Iterator[Path]:
    """A container root with /dst holding one old file, and a local source beside it."""
    tmp = Path(tempfile.mkdtemp(prefix="entrydigest-"))
    (tmp / "root" / "dst").mkdir(parents=True)
    (tmp / "root" / "dst" / "keep").write_bytes(b"old")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp)


def fresh_box() -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="entrydigest-"))
    (tmp / "root" / "dst").mkdir(parents=True)
    (tmp / "root" / "dst" / "keep").write_bytes(b"old")
    return tmp


@PROPS
@given(trees(), st.sampled_from([0, 16 << 20]), st.sampled_from([700, 1 << 20]))
def test_any_tree_round_trips_with_a_digest_per_file(tree: dict[str, bytes], read_whole: int,
                                                    chunk: int) -> None:
    tmp = fresh_box()
    try:
        write_tree(tmp / "src", tree)
        raw = pack(tmp / "src", read_whole)
        recs = pax_records(raw)
        for rel, data in tree.items():
            assert recs[rel]["AGGAPI.sha256"] == hashlib.sha256(data).hexdigest()
            assert recs[rel]["AGGAPI.entryDigests"] == "sha256"
        extract(tmp / "root", raw, chunk)
        assert read_tree(tmp / "root" / "dst") == {**tree, "keep": b"old"}
        assert temp_leftovers(tmp / "root") == []
    finally:
        shutil.rmtree(tmp)


@PROPS
@given(trees(min_files=1).filter(lambda t: any(t.values())), st.data())
def test_any_flipped_data_byte_is_caught_naming_the_file(tree: dict[str, bytes],
                                                        data: st.DataObject) -> None:
    """The whole tar's sha256 (a query parameter) is not part of this: the tar alone,
    as the agent parses it, must refuse any one corrupted byte of any file's data."""
    tmp = fresh_box()
    try:
        write_tree(tmp / "src", tree)
        raw = bytearray(pack(tmp / "src", 16 << 20))
        name, off, size = data.draw(st.sampled_from(data_spans(bytes(raw))))
        at = off + data.draw(st.integers(0, size - 1))
        raw[at] ^= data.draw(st.integers(1, 255))
        before = snapshot(tmp / "root" / "dst")
        with pytest.raises(StatusError) as err:
            extract(tmp / "root", bytes(raw))
        assert err.value.code == 400 and err.value.reason == "Invalid"
        assert f"/dst/{name}: sha256 mismatch" in err.value.message
        assert snapshot(tmp / "root" / "dst") == before
        assert temp_leftovers(tmp / "root") == []
    finally:
        shutil.rmtree(tmp)


def _file(name: str, data: bytes, records: dict[str, str] | None) -> bytes:
    return ts.header(name, ts.REG, size=len(data), records=records) + data + ts.pad(len(data))


GOOD = record(hashlib.sha256(b"abc").hexdigest())


@pytest.mark.parametrize(("tar", "why"), [
    (ANNOUNCEMENT + _file("ok", b"abc", GOOD) + _file("f", b"abc", None),
     "tar entry 'f' carries no AGGAPI.sha256 record"),
    (ANNOUNCEMENT + _file("f", b"abc", {"AGGAPI.sha256": "ABC" * 21 + "A"}),
     "tar entry 'f' has a malformed AGGAPI.sha256 record"),
    (ANNOUNCEMENT + _file("f", b"abc", {"AGGAPI.sha256": "x"}),
     "malformed AGGAPI.sha256"),
    (ANNOUNCEMENT + ts.pax_header("p", GOOD, typeflag=ts.PAX) + _file("f", b"abc", GOOD),
     "duplicate PAX record AGGAPI.sha256"),
    (ANNOUNCEMENT + ts.pax_header("g", GOOD) + _file("f", b"abc", None),
     "AGGAPI.sha256 in a global header"),
    (ANNOUNCEMENT + ts.header("d/", ts.DIR, records=GOOD),
     "'d/' is not a regular file but carries"),
    (ts.pax_header("g", {"AGGAPI.entryDigests": "md5"}) + _file("f", b"abc", GOOD),
     "unsupported AGGAPI.entryDigests 'md5'"),
    (_file("f", b"abc", None) + ANNOUNCEMENT + _file("g", b"abc", GOOD),
     "AGGAPI.entryDigests came after the first entry"),
])
def test_missing_malformed_or_duplicate_record_is_refused(box: Path, tar: bytes,
                                                          why: str) -> None:
    before = snapshot(box / "root" / "dst")
    with pytest.raises(TarError, match=re.escape(why)):  # upload_tar: 400 "invalid tar: ..."
        extract(box / "root", tar + ts.END)
    assert snapshot(box / "root" / "dst") == before
    assert temp_leftovers(box / "root") == []


def test_duplicate_record_in_one_header_is_refused(box: Path) -> None:
    digest = hashlib.sha256(b"abc").hexdigest()
    body = b"".join(ts._pax_record("AGGAPI.sha256", digest) for _ in range(2))
    hdr = ts._ustar(b"PaxHeader/f", ts.PAX, len(body), 0o644, 0, 0, 0) + body + ts.pad(len(body))
    with pytest.raises(TarError, match=r"duplicate PAX record AGGAPI\.sha256"):
        extract(box / "root", ANNOUNCEMENT + hdr + _file("f", b"abc", None) + ts.END)


def test_an_older_clients_tar_without_records_is_accepted(box: Path) -> None:
    """Mixed versions during an upgrade: an older ncp announces nothing and sends no
    records; its tar is still checked as a whole by the sha256 query parameter."""
    extract(box / "root", _file("f", b"abc", None) + _file("g", b"xyz", None) + ts.END)
    assert read_tree(box / "root" / "dst") == {"f": b"abc", "g": b"xyz", "keep": b"old"}


def test_a_record_in_an_unannounced_tar_is_still_checked(box: Path) -> None:
    bad = record(hashlib.sha256(b"abd").hexdigest())
    with pytest.raises(StatusError, match="/dst/f: sha256 mismatch"):
        extract(box / "root", _file("f", b"abc", bad) + ts.END)
    assert read_tree(box / "root" / "dst") == {"keep": b"old"}
