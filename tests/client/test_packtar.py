"""Directory uploads' tar (aggapi.client.packtar): modes travel only with ``preserve``
(``ncp --no-preserve`` is kubectl cp's), and the announced size is always exact."""

from __future__ import annotations

import asyncio
import io
import os
import stat
import tarfile
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from aggapi.client.packtar import (
    CHUNK,
    DEFAULT_DIR_MODE,
    DEFAULT_FILE_MODE,
    list_tree,
    tar_size,
    tar_stream,
)

MODES = st.integers(0o400, 0o777).filter(lambda m: m & 0o500 == 0o500)


async def _collect(root: Path, preserve: bool) -> bytes:
    listing = list_tree(root)
    out = b"".join([c async for c in tar_stream(root, listing, preserve=preserve)])
    assert len(out) == tar_size(root, listing)
    return out


def _modes(data: bytes) -> dict[str, tuple[bool, int, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        return {m.name.rstrip("/"): (m.isdir(), m.mode, m.uid, m.gid) for m in tf}


@settings(max_examples=30, deadline=None)
@given(file_modes=st.lists(MODES, min_size=1, max_size=4), dir_mode=MODES,
       preserve=st.booleans())
def test_modes_travel_only_when_preserved(file_modes: list[int], dir_mode: int,
                                          preserve: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "d").mkdir()
        want: dict[str, int] = {}
        for i, m in enumerate(file_modes):
            f = root / "d" / f"f{i}"
            f.write_bytes(os.urandom(i * 100))
            f.chmod(m)
            want[f"d/f{i}"] = m if preserve else DEFAULT_FILE_MODE
        (root / "d").chmod(dir_mode)
        want["d"] = dir_mode if preserve else DEFAULT_DIR_MODE
        try:
            got = _modes(asyncio.run(_collect(root, preserve)))
        finally:
            (root / "d").chmod(0o755)
    assert {k: v[1] for k, v in got.items()} == want
    assert got["d"][0] and not any(v[0] for k, v in got.items() if k != "d")
    # Owners never travel, preserved or not: the agent sets the copy's user.
    assert {(v[2], v[3]) for v in got.values()} == {(0, 0)}


def test_setuid_bits_are_dropped_without_preserve(tmp_path: Path) -> None:
    f = tmp_path / "suid"
    f.write_bytes(b"x")
    f.chmod(0o4755)
    kept = _modes(asyncio.run(_collect(tmp_path, True)))["suid"][1]
    plain = _modes(asyncio.run(_collect(tmp_path, False)))["suid"][1]
    assert stat.S_IMODE(kept) == 0o4755 and plain == DEFAULT_FILE_MODE


@settings(derandomize=True, database=None, max_examples=12, deadline=None)
@given(sizes=st.lists(st.sampled_from([0, 1, 511, 512, 4096, CHUNK - 1, CHUNK + 1, 3 * CHUNK]),
                      min_size=1, max_size=6),
       small=st.integers(0, 1500))
def test_pieces_are_about_a_mib_and_the_tar_is_whole(sizes: list[int], small: int) -> None:
    """Many small files go out in pieces of about CHUNK bytes, not three pieces per file
    (header, data, padding: each its own write and TLS record on every hop of the copy),
    and big files in CHUNK reads; the tar holds every file's bytes, whatever the mix."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        want = {}
        for i in range(small):
            d = root / f"s{i // 100}"
            d.mkdir(exist_ok=True)
            want[f"s{i // 100}/f{i}"] = os.urandom(i % 700)
        for i, n in enumerate(sizes):
            want[f"big{i}"] = os.urandom(n)
        for rel, data in want.items():
            (root / rel).write_bytes(data)
        listing = list_tree(root)
        pieces = asyncio.run(_pieces_of(root))
        out = b"".join(pieces)
        assert len(out) == tar_size(root, listing)
        # Every piece but the last reaches CHUNK, or is one read of a big file.
        assert all(len(p) >= CHUNK for p in pieces[:-1]), [len(p) for p in pieces]
        assert len(pieces) <= len(out) // CHUNK + 1
        with tarfile.open(fileobj=io.BytesIO(out)) as tf:
            got = {m.name: tf.extractfile(m).read()  # type: ignore[union-attr]
                   for m in tf if m.isfile()}
        assert got == want


async def _pieces_of(root: Path) -> list[bytes]:
    return [c async for c in tar_stream(root, list_tree(root))]
