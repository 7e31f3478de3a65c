"""Directory downloads whose digests trail their files (digest=trailer, issue 27): the
agent reads each file once, hashing as it sends, and puts its sha256 on the entry after
it (AGGAPI.previousSha256; the closing "./" entry for the last file). The tars come
from the agent's real walker over a real directory and go through the client's real
extract_dir, which checks each file before anything is placed."""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.client.errors import IntegrityError, TransferError
from aggapi.tar import stream as ts
from aggapi.tar.entrydigest import (
    TRAILING_ANNOUNCEMENT,
    EntryDigests,
    previous,
    record,
)
from aggapi.tar.parse import PREVIOUS_SHA256_RECORD, SHA256_RECORD, TarEntry, TarError
from tests.client.test_extract_digests import extract, leftovers, walk
from tests.filetrees import PreadCounter, read_tree, trees, write_tree

# Every test on both extraction paths (the compiled loop where it is built).
pytestmark = pytest.mark.usefixtures("extract_path")

PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def members(raw: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        return tf.getmembers()


@PROPS
@given(trees(), st.sampled_from([4096, 1 << 20]))
def test_any_tree_round_trips_with_each_digest_after_its_file(tree: dict[str, bytes],
                                                             chunk: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dl-trailing-"))
    try:
        write_tree(tmp / "src", tree)
        raw = walk(tmp / "src", chunk, trailing=True)
        ms = members(raw)
        for m, nxt in itertools.pairwise(ms):
            assert SHA256_RECORD not in m.pax_headers
            if m.isreg():  # the next entry carries the digest of this one's data
                want = hashlib.sha256(tree[m.name]).hexdigest()
                assert nxt.pax_headers[PREVIOUS_SHA256_RECORD] == want
            else:
                assert PREVIOUS_SHA256_RECORD not in nxt.pax_headers
        res = extract(raw, tmp / "dst")
        assert res.verified
        assert read_tree(tmp / "dst") == tree
    finally:
        shutil.rmtree(tmp)


@PROPS
@given(trees(min_files=1), st.data())
def test_any_altered_trailing_digest_is_caught_naming_its_file(tree: dict[str, bytes],
                                                               data: st.DataObject) -> None:
    """A hex digit of one trailing record changed (still well-formed): the file before
    that entry is named, nothing placed."""
    tmp = Path(tempfile.mkdtemp(prefix="dl-trailing-"))
    try:
        write_tree(tmp / "src", tree)
        raw = bytearray(walk(tmp / "src", trailing=True))
        ms = members(bytes(raw))
        owners = [m.name for m in ms[:-1] if m.isreg()]
        key = f" {PREVIOUS_SHA256_RECORD}=".encode()
        spots = [m.start() + len(key) for m in re.finditer(re.escape(key), bytes(raw))]
        assert len(spots) == len(owners)
        i = data.draw(st.integers(0, len(spots) - 1))
        at = spots[i] + data.draw(st.integers(0, 63))
        raw[at] = ord("0") if raw[at] != ord("0") else ord("1")
        with pytest.raises(IntegrityError,
                           match=re.escape(f"sha256 mismatch for '{owners[i]}'")):
            extract(bytes(raw), tmp / "dst")
        assert not os.path.lexists(tmp / "dst") and leftovers(tmp) == []
    finally:
        shutil.rmtree(tmp)


def test_each_file_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files above a chunk are hashed as they are sent (today's form reads them twice)."""
    tree = {"a": os.urandom(3 << 20), "b/c": os.urandom((1 << 20) + 1), "d": b"x"}
    write_tree(tmp_path / "src", tree)
    # The Python walk's reads (os.pread): the agent's compiled loop of small files
    # (aggapi.agent.copy._fastwalk) reads each with one pread of its own, not counted here.
    monkeypatch.setenv("AGGAPI_PURE_PYTHON", "1")
    read = PreadCounter(monkeypatch)
    raw = walk(tmp_path / "src", trailing=True)
    assert read.bytes == sum(map(len, tree.values()))
    assert read_tree_of(raw, tmp_path / "dst") == tree


def read_tree_of(raw: bytes, dst: Path) -> dict[str, bytes]:
    assert extract(raw, dst).verified
    return read_tree(dst)


def _file(name: str, data: bytes, records: dict[str, str] | None = None) -> bytes:
    return ts.header(name, ts.REG, size=len(data), records=records) + data + ts.pad(len(data))


def _end(records: dict[str, str] | None = None) -> bytes:
    return (ts.pax_header("./", {"AGGAPI.complete": "true", **(records or {})},
                          typeflag=ts.PAX)
            + ts.header("./", ts.DIR, mode=0o755) + ts.END)


ABC = hashlib.sha256(b"abc").hexdigest()


@pytest.mark.parametrize(("tar", "why"), [
    (TRAILING_ANNOUNCEMENT + _file("f", b"abc") + _file("g", b"abc") + _end(previous(ABC)),
     "the sha256 of 'f' did not follow it"),
    (TRAILING_ANNOUNCEMENT + _file("f", b"abc") + _end(),
     "the sha256 of 'f' did not follow it"),
    (TRAILING_ANNOUNCEMENT + ts.header("d/", ts.DIR, records=previous(ABC)) + _end(),
     "follows no regular file"),
    (TRAILING_ANNOUNCEMENT + _file("f", b"abc") + _end({PREVIOUS_SHA256_RECORD: "0" * 63}),
     "malformed AGGAPI.previousSha256 record"),
    (TRAILING_ANNOUNCEMENT + _file("f", b"abc", record(ABC)) + _end(previous(ABC)),
     "carries a AGGAPI.sha256 record in a stream whose digests trail"),
    (TRAILING_ANNOUNCEMENT + _file("f", b"abc")
     + ts.pax_header("p", previous(ABC), typeflag=ts.PAX) + _end(previous(ABC)),
     "duplicate PAX record AGGAPI.previousSha256"),
    (TRAILING_ANNOUNCEMENT + ts.pax_header("g", previous(ABC)) + _end(),
     "AGGAPI.previousSha256 in a global header"),
    # A file after the completion record, the stream ending before its digest.
    (TRAILING_ANNOUNCEMENT + _end()[:-len(ts.END)] + _file("late", b"abc") + ts.END,
     "ended before the sha256 of 'late'"),
])
def test_a_hostile_trailing_stream_fails_the_copy(tmp_path: Path, tar: bytes,
                                                  why: str) -> None:
    with pytest.raises(TransferError, match=re.escape(why)):
        extract(tar, tmp_path / "dst")
    assert os.listdir(tmp_path) == []


def test_a_record_without_the_announcement_is_refused(tmp_path: Path) -> None:
    """An older agent's stream (no announcement) never carries the record: one that
    does is not taken as a digest of anything."""
    with pytest.raises(TransferError, match="follows no regular file"):
        extract(_file("f", b"abc") + _end(previous(ABC)), tmp_path / "dst")


def test_only_a_reader_that_asked_takes_trailing_digests() -> None:
    """The agent's upload side (EntryDigests()) never asks: it refuses the form."""
    first = TarEntry(name="f", typeflag=ts.REG, size=0, mode=0o644, uid=0, gid=0,
                     mtime_ns=0, linkname="",
                     pax={"AGGAPI.entryDigests": "sha256-next"})
    with pytest.raises(TarError, match=r"unsupported AGGAPI\.entryDigests 'sha256-next'"):
        EntryDigests().expected(first)
    assert EntryDigests(trailing_ok=True).expected(first) is None
