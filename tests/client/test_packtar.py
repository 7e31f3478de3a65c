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
