"""The files the copy benchmarks send and check: random files (one, or a tree of small
ones, 100 to a directory, as in a source tree) and their sha256."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

MiB = 1 << 20


def source_tree(root: Path, files: int, size: int) -> Path:
    """``files`` random files of ``size`` bytes under ``root`` (made here), 100 to a
    directory."""
    for i in range(files):
        d = root / f"d{i // 100:03d}"
        if i % 100 == 0:
            d.mkdir(parents=True)
        (d / f"f{i % 100:02d}.dat").write_bytes(os.urandom(size))
    return root


def make_file(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 * MiB))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def file_sha(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 * MiB):
            h.update(block)
    return h.hexdigest()
