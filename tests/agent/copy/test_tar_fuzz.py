"""Fuzzing the agent's tar extraction (parser, TarSink and TarExtractor together) on a
real directory: a generated tar is either extracted, or refused with a TarError, a
StatusError or an OSError that upload_tar answers with a 4xx Status, and a refusal
leaves the target as it was, with no temp files.

Run with ``-s`` to see how many cases ran.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggapi.agent.copy.fserrors import fs_status
from aggapi.agent.copy.quotas import CopyLimits
from aggapi.status import StatusError
from aggapi.tar.parse import TarError
from tests import tarcraft as tc
from tests.agent.copy.conftest import extract_tar, snapshot, temp_leftovers

RUNS = {"sink": 0, "refused": 0}

GOOD_NAMES = st.lists(st.sampled_from(["a", "b", "c", "."]), min_size=1,
                      max_size=3).map("/".join)
NAMES = st.one_of(
    GOOD_NAMES, GOOD_NAMES, GOOD_NAMES,
    st.lists(st.sampled_from(["a", "b", ".", "..", "", "GNUSparseFile.1", "x\0y"]),
             min_size=1, max_size=4).map("/".join),
    st.sampled_from(["./", "/abs", "keep", "keep/x", "d/", "a" * 300]))


@st.composite
def member(draw: st.DrawFn) -> bytes:
    name = draw(NAMES).encode()
    t = draw(st.one_of(st.sampled_from([b"0", b"5", b"2", b"1"]),
                       st.sampled_from([b"0", b"5", b"3", b"6", b"7", b"x", b"g", b"S"])))
    if t in (b"x", b"g"):
        recs = draw(st.lists(st.tuples(
            st.sampled_from([b"path", b"linkpath", b"size", b"mtime", b"uid", b"comment",
                             b"GNU.sparse.map"]),
            st.one_of(NAMES.map(str.encode),
                      st.sampled_from([b"5", b"-1", b"1e9", b"99999999999999999999"]))),
            max_size=3))
        return tc.pax(recs, t)
    fields = {"linkname": draw(NAMES).encode()} if t in (b"1", b"2") else {}
    if draw(st.integers(0, 5)) == 0:
        fields["mtime"] = draw(st.sampled_from([b"\x80" + b"\x7f" * 11, b"\xff" * 12,
                                                b"77777777777\0", b"zz"]))
    data = b"d" * draw(st.integers(0, 700)) if t in (b"0", b"7") else b""
    return tc.block(name, t, len(data), fields) + tc.padded(data)


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\ntar extraction fuzz cases run: {RUNS}")


def extract(root_dir: Path, raw: bytes, chunk: int) -> None:
    extract_tar(root_dir, raw, CopyLimits(size_limit=1 << 20, max_entries=20, max_depth=3,
                                          state_dir=str(root_dir.parent / "state")),
                chunk=chunk)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(member(), max_size=6), st.integers(0, 5).map(bool),
       st.sampled_from([100, 512, 1 << 20]))
def test_fuzz_extraction_refuses_cleanly(members: list[bytes], end: bool, chunk: int) -> None:
    RUNS["sink"] += 1
    tmp = Path(tempfile.mkdtemp(prefix="tarfuzz-"))
    try:
        root = tmp / "root"
        (root / "dst").mkdir(parents=True)
        (root / "dst" / "keep").write_bytes(b"old")
        before = snapshot(root / "dst")
        raw = b"".join(members) + (tc.ZERO2 if end else b"")
        status: StatusError | None = None
        try:
            extract(root, raw, chunk)
        except TarError as exc:
            status = StatusError(400, str(exc))
        except StatusError as exc:
            status = exc
        except OSError as exc:  # upload_tar maps these the same way
            status = fs_status(exc, "/dst")
        if status is not None:
            RUNS["refused"] += 1
            assert 400 <= status.code < 500, status
            assert snapshot(root / "dst") == before
        assert temp_leftovers(root) == []
    finally:
        shutil.rmtree(tmp)

