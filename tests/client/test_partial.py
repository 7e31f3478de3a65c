"""PartialFile keeps every byte and its sha256 across writeback steps (which drop pages
from the page cache), and a resumed file continues where it stopped."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.client.partial import FLUSH_STEP, Origin, PartialFile


def _origin(data: bytes) -> Origin:
    return Origin(source="ns/pod/c:/f", etag='"e"', size=len(data),
                  sha256=hashlib.sha256(data).hexdigest())


@settings(max_examples=8, deadline=None)
@given(sizes=st.lists(st.integers(1, 3 * FLUSH_STEP // 2), min_size=1, max_size=6),
       seed=st.integers(0, 255))
def test_bytes_and_digest_survive_writeback_steps(tmp_path_factory: pytest.TempPathFactory,
                                                  sizes: list[int], seed: int) -> None:
    d = tmp_path_factory.mktemp("p")
    pieces = [bytes([(seed + i) % 256]) * n for i, n in enumerate(sizes)]
    data = b"".join(pieces)
    p = PartialFile(d / "out")
    p.start(_origin(data))
    for piece in pieces:
        p.write(piece)
    assert p.size == len(data)
    assert p.hash.hexdigest() == hashlib.sha256(data).hexdigest()
    p.commit(0o600)
    assert (d / "out").read_bytes() == data


def test_resume_continues_after_the_bytes_kept(tmp_path: Path) -> None:
    data = os.urandom(2 * FLUSH_STEP + 12345)
    cut = FLUSH_STEP + 777
    p = PartialFile(tmp_path / "out")
    origin = _origin(data)
    p.start(origin)
    p.write(data[:cut])
    p.close()
    q = PartialFile(tmp_path / "out")
    assert q.resumable(origin.source) == origin
    assert q.size == cut
    q.write(data[cut:])
    assert q.hash.hexdigest() == origin.sha256
    q.commit()
    assert (tmp_path / "out").read_bytes() == data
